#include "raw.hpp"

#include <poll.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <system_error>

namespace bench {
namespace {

double micros(Clock::time_point started) {
  return std::chrono::duration<double, std::micro>(Clock::now() - started).count();
}

}  // namespace

std::string Raw::provider(Wait wait) {
  select(wait);
  return current_->endpoint->describe().provider;
}

Sample Raw::run(const Point& point) {
  select(point.wait);
  Sample sample;
  const auto mode = wait_mode(point.wait);
  const bool latency = point.depth == 1;
  std::vector<Op> ops(static_cast<std::size_t>(point.depth));
  std::vector<Op*> backlog;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(setup_.duration);
  for (int i = 0; i < point.depth; ++i) {
    ops[static_cast<std::size_t>(i)].lane = i;
    backlog.push_back(&ops[static_cast<std::size_t>(i)]);
  }
  std::size_t in_flight = 0;
  fi_cq_entry entries[16];
  bool spinning = false;
  Clock::time_point spin_start;
  while (in_flight > 0 || !backlog.empty()) {
    post_backlog(point, backlog, in_flight);
    const ssize_t n = fi_cq_read(current_->endpoint->cq(), entries, 16);
    if (n > 0) {
      spinning = false;
      for (ssize_t i = 0; i < n; ++i) {
        auto* op = static_cast<Op*>(entries[i].op_context);
        --in_flight;
        ++sample.transfers;
        if (latency) sample.latencies_us.push_back(micros(op->started));
        if (Clock::now() < end) backlog.push_back(op);
      }
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry error{};
      if (fi_cq_readerr(current_->endpoint->cq(), &error, 0) > 0 && error.op_context != nullptr) {
        --in_flight;
        ++sample.transfers;
        ++sample.errors;
      }
      continue;
    }
    if (!backlog.empty() || mode == dma::WaitMode::busy_poll) continue;
    if (mode == dma::WaitMode::adaptive) {  // poll for up to the spin budget, as the library does
      if (!spinning) spin_start = Clock::now();
      spinning = true;
      if (Clock::now() - spin_start < setup_.spin_budget) continue;
    }
    spinning = false;
    wait_fd();
  }
  sample.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return sample;
}

void Raw::post_backlog(const Point& point, std::vector<Op*>& backlog, std::size_t& in_flight) {
  std::size_t posted = 0;
  while (posted < backlog.size()) {
    Op* op = backlog[posted];
    const bool more = posted + 1 < backlog.size();
    std::byte* buffer = setup_.local.data() + static_cast<std::size_t>(op->lane) * point.size;
    iovec iov{buffer, point.size};
    void* desc = nullptr;
    fi_rma_iov rma{setup_.peer.remote_address + static_cast<std::uint64_t>(op->lane) * point.size, point.size,
                   setup_.peer.remote_key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = current_->peer;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = op;
    op->started = Clock::now();
    const std::uint64_t flags = FI_COMPLETION | (more ? FI_MORE : 0);
    const ssize_t rc = point.direction == dma::Direction::ToPeer
                           ? fi_writemsg(current_->endpoint->endpoint(), &msg, flags | FI_DELIVERY_COMPLETE)
                           : fi_readmsg(current_->endpoint->endpoint(), &msg, flags);
    if (rc != 0) break;  // -FI_EAGAIN: retried after the next CQ read
    ++posted;
    ++in_flight;
  }
  backlog.erase(backlog.begin(), backlog.begin() + static_cast<std::ptrdiff_t>(posted));
}

// One endpoint per wait mode, opened as the library opens its service's: busy polling has a CQ
// without a wait object (FI_WAIT_NONE), the other modes FI_WAIT_FD.
void Raw::select(Wait wait) {
  auto& side = sides_[wait];
  if (!side.endpoint) {
    side.endpoint = std::make_unique<dma::Endpoint>();
    side.endpoint->open(setup_.configuration(wait));
    std::error_code ec;
    side.peer = side.endpoint->insert_address(setup_.peer.address, ec);
    if (ec) throw std::system_error(ec, "raw baseline: fi_av_insert");
  }
  current_ = &side;
}

// fi_trywait before blocking, as the library does; a wake without completions is legal.
void Raw::wait_fd() {
  fid* fids[] = {&current_->endpoint->cq()->fid};
  if (fi_trywait(current_->endpoint->fabric(), fids, 1) != 0) return;
  pollfd p{current_->endpoint->wait_fd(), POLLIN, 0};
  (void)poll(&p, 1, 100);
}

}  // namespace bench
