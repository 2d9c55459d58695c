#include <dma/kv/hello_bindings.hpp>

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <system_error>

namespace dma::kv {
namespace {

// 128 bits from getrandom(2), as 32 hex digits.
std::string new_token() {
  unsigned char bytes[16];
  std::size_t filled = 0;
  while (filled < sizeof bytes) {
    const ssize_t n = getrandom(bytes + filled, sizeof bytes - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "getrandom for a DMA.HELLO token");
    }
    filled += static_cast<std::size_t>(n);
  }
  static constexpr char digits[] = "0123456789abcdef";
  std::string token;
  token.reserve(2 * sizeof bytes);
  for (const unsigned char b : bytes) {
    token += digits[b >> 4];
    token += digits[b & 0xf];
  }
  return token;
}

}  // namespace

std::optional<Binding> HelloBindings::bind(std::uint64_t id, const dma::PeerAddress& address,
                                           std::vector<std::uint64_t>& dropped) {
  std::string token = new_token();
  std::lock_guard lock(mutex_);
  if (by_token_.size() >= limits_.capacity) {
    auto oldest = by_token_.end();
    for (auto it = by_token_.begin(); it != by_token_.end(); ++it) {
      if (!it->second.held && (oldest == by_token_.end() || it->second.last_used < oldest->second.last_used)) {
        oldest = it;
      }
    }
    if (oldest == by_token_.end()) return std::nullopt;
    dropped.push_back(oldest->second.binding.id);
    token_of_.erase(oldest->second.binding.id);
    by_token_.erase(oldest);
    ++dropped_;
  }
  Entry entry{Binding{id, address, token}, true, false, Clock::now()};
  token_of_[id] = token;
  return by_token_.emplace(std::move(token), std::move(entry)).first->second.binding;
}

std::optional<Binding> HelloBindings::find(std::string_view token, std::uint64_t own) {
  std::lock_guard lock(mutex_);
  const auto it = by_token_.find(std::string(token));
  if (it == by_token_.end()) return std::nullopt;
  it->second.last_used = Clock::now();
  if (it->second.binding.id != own) it->second.shared = true;
  return it->second.binding;
}

void HelloBindings::touch(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  const auto token = token_of_.find(id);
  if (token == token_of_.end()) return;
  by_token_.at(token->second).last_used = Clock::now();
}

bool HelloBindings::release(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  const auto token = token_of_.find(id);
  if (token == token_of_.end()) return false;
  const auto entry = by_token_.find(token->second);
  if (!entry->second.shared) {
    by_token_.erase(entry);
    token_of_.erase(token);
    return true;
  }
  entry->second.held = false;
  entry->second.last_used = Clock::now();
  return false;
}

std::vector<std::uint64_t> HelloBindings::sweep(Clock::time_point now) {
  std::vector<std::uint64_t> ids;
  std::lock_guard lock(mutex_);
  for (auto it = by_token_.begin(); it != by_token_.end();) {
    if (!it->second.held && now - it->second.last_used >= limits_.idle) {
      ids.push_back(it->second.binding.id);
      token_of_.erase(it->second.binding.id);
      it = by_token_.erase(it);
      ++dropped_;
    } else {
      ++it;
    }
  }
  return ids;
}

std::size_t HelloBindings::size() const {
  std::lock_guard lock(mutex_);
  return by_token_.size();
}

std::uint64_t HelloBindings::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace dma::kv
