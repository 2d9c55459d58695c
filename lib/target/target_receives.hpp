// The receives a Target keeps posted where each peer's write with immediate data consumes one:
// efa-direct answering FI_RX_CQ_DATA (libfabric 2.4 on, docs/notes/efa-direct.md). Without a posted
// receive such a write waits in the device's retries (FI_OPT_EFA_RNR_RETRY) and then fails.
#pragma once

#include "dma/detail/fid.hpp"
#include "dma/endpoint.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <system_error>
#include <vector>

namespace dma::detail {

class TargetReceives {
 public:
  /// Posts one receive with `context` as its operation context; returns libfabric's code.
  using Post = std::function<int(void* context)>;

  /// None: the provider needs no receives.
  TargetReceives() = default;

  /// Keeps `count` receives posted through `post`, and posts them now. A post that fails
  /// (-FI_EAGAIN while the queue is full) is retried at the next completion.
  void start(std::size_t count, Post post);

  /// Opens the receives `endpoint` needs (EndpointInfo::immediate_data_receives; none for 0): one
  /// small buffer registered for FI_RECV, which every receive names (efa-direct needs a
  /// descriptor; a write with immediate data puts nothing there), and fi_recv on the endpoint.
  void open(Endpoint& endpoint, std::error_code& ec);

  /// Reads a completion: if it consumed one of the receives, posts that receive again. Returns
  /// whether the entry is a peer's write with immediate data (FI_REMOTE_CQ_DATA), which is to be
  /// notified once, whether or not it consumed a receive.
  bool notifies(const fi_cq_data_entry& entry) noexcept;

  /// Reads an error completion: whether it is one of the receives' (flushed when the endpoint
  /// closes), in which case it is no peer's error, and the receive is posted again.
  bool owns_error(const fi_cq_err_entry& entry) noexcept;

  /// Receives to keep posted.
  std::size_t count() const noexcept { return contexts_.size(); }
  /// Receives posted now.
  std::size_t posted() const noexcept { return posted_; }
  /// Receives consumed so far (each re-posted).
  std::uint64_t consumed() const noexcept { return consumed_; }
  /// Posts that failed (and were retried later).
  std::uint64_t failed_posts() const noexcept { return failed_posts_; }

 private:
  bool take(void* context) noexcept;
  void post_pending() noexcept;

  struct Slot {
    fi_context2 context{};  // first: the operation context the completion hands back
    bool posted = false;
  };
  std::vector<Slot> contexts_;
  std::vector<std::size_t> pending_;
  Post post_;
  std::size_t posted_ = 0;
  std::uint64_t consumed_ = 0;
  std::uint64_t failed_posts_ = 0;
  std::array<std::byte, 64> buffer_{};
  Fid<fid_mr> mr_;
};

}  // namespace dma::detail
