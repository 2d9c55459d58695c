// The baseline: the same transfers as a plain loop over fi_writemsg / fi_readmsg and fi_cq_read,
// with the same flags (FI_DELIVERY_COMPLETE on writes, FI_MORE inside bursts) and depth.
#pragma once

#include "setup.hpp"

#include <dma/dma.hpp>

#include <rdma/fabric.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace bench {

class Raw {
 public:
  explicit Raw(const Setup& setup) : setup_(setup) {}

  /// The provider the endpoint for this wait mode runs on, e.g. "tcp;ofi_rxm".
  std::string provider(Wait wait);

  Sample run(const Point& point);

 private:
  struct Op {
    fi_context2 context{};  // first: the CQ hands this address back
    int lane = 0;
    Clock::time_point started;
  };
  struct Side {
    std::unique_ptr<dma::Endpoint> endpoint;
    fi_addr_t peer = FI_ADDR_NOTAVAIL;
  };

  void post_backlog(const Point& point, std::vector<Op*>& backlog, std::size_t& in_flight);
  void select(Wait wait);
  void wait_fd();

  const Setup& setup_;
  std::map<Wait, Side> sides_;
  Side* current_ = nullptr;
};

}  // namespace bench
