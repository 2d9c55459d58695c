// Every local address the engine had, the current one last. Replacing the endpoint changes the
// address; a reference handed out earlier stays valid (a deque never moves its elements), so a
// span of an old address never dangles. Written on the strand, read from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace dma::detail {

class AddressHistory {
 public:
  void push(std::vector<std::uint8_t> address) {
    std::lock_guard lock(mutex_);
    addresses_.push_back(std::move(address));
  }
  const std::vector<std::uint8_t>& current() const noexcept {
    std::lock_guard lock(mutex_);
    return addresses_.back();
  }

 private:
  mutable std::mutex mutex_;
  std::deque<std::vector<std::uint8_t>> addresses_;
};

}  // namespace dma::detail
