#include "target_receives.hpp"

#include "dma/error.hpp"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <cstdint>
#include <utility>

namespace dma::detail {

void TargetReceives::start(std::size_t count, Post post) {
  contexts_ = std::vector<Slot>(count);  // never resized again: the provider holds the addresses
  pending_.clear();
  pending_.reserve(count);
  post_ = std::move(post);
  posted_ = 0;
  for (std::size_t i = 0; i < count; ++i)
    pending_.push_back(count - 1 - i);
  post_pending();
}

void TargetReceives::open(Endpoint& endpoint, std::error_code& ec) {
  ec.clear();
  const std::size_t count = endpoint.describe().immediate_data_receives;
  if (count == 0) return;
  mr_ = endpoint.register_memory(buffer_.data(), buffer_.size(), FI_RECV, 0, ec);
  if (ec) return;
  void* desc = fi_mr_desc(mr_.get());
  fid_ep* ep = endpoint.endpoint();
  start(count, [this, ep, desc](void* context) {
    return static_cast<int>(fi_recv(ep, buffer_.data(), buffer_.size(), desc, FI_ADDR_UNSPEC, context));
  });
  if (posted_ == 0) ec = fabric_error(-FI_EAGAIN);  // not one receive: no write with immediate data gets in
}

bool TargetReceives::notifies(const fi_cq_data_entry& entry) noexcept {
  (void)take(entry.op_context);
  return (entry.flags & FI_REMOTE_CQ_DATA) != 0;
}

bool TargetReceives::owns_error(const fi_cq_err_entry& entry) noexcept { return take(entry.op_context); }

bool TargetReceives::take(void* context) noexcept {
  if (contexts_.empty() || context == nullptr) return false;
  // Any other context (a peer's write without a receive, tcp's entries) is none of ours.
  const auto at = reinterpret_cast<std::uintptr_t>(context);
  const auto first = reinterpret_cast<std::uintptr_t>(contexts_.data());
  if (at < first || at >= first + contexts_.size() * sizeof(Slot) || (at - first) % sizeof(Slot) != 0) return false;
  const std::size_t index = (at - first) / sizeof(Slot);
  Slot& slot = contexts_[index];
  if (!slot.posted) return false;
  slot.posted = false;
  --posted_;
  ++consumed_;
  pending_.push_back(index);
  post_pending();
  return true;
}

void TargetReceives::post_pending() noexcept {
  while (!pending_.empty()) {
    Slot& slot = contexts_[pending_.back()];
    if (post_(&slot.context) != 0) {
      ++failed_posts_;
      return;
    }
    pending_.pop_back();
    slot.posted = true;
    ++posted_;
  }
}

}  // namespace dma::detail
