#include "types.hpp"

#include <charconv>

namespace bench {

std::string_view to_string(Api api) noexcept {
  switch (api) {
    case Api::awaitable:
      return "awaitable";
    case Api::handler:
      return "handler";
    case Api::callback:
      return "callback";
    case Api::raw:
      return "raw";
  }
  return "?";
}

std::string_view to_string(Wait wait) noexcept {
  switch (wait) {
    case Wait::fd:
      return "fd";
    case Wait::adaptive:
      return "adaptive";
    case Wait::busy:
      return "busy";
  }
  return "?";
}

std::string_view to_string(dma::Direction direction) noexcept {
  return direction == dma::Direction::ToPeer ? "write" : "read";
}

std::optional<Api> api_from(std::string_view name) noexcept {
  for (const Api api : {Api::awaitable, Api::handler, Api::callback, Api::raw}) {
    if (to_string(api) == name) return api;
  }
  return std::nullopt;
}

std::optional<Wait> wait_from(std::string_view name) noexcept {
  for (const Wait wait : {Wait::fd, Wait::adaptive, Wait::busy}) {
    if (to_string(wait) == name) return wait;
  }
  return std::nullopt;
}

std::optional<dma::Direction> direction_from(std::string_view name) noexcept {
  if (name == "write") return dma::Direction::ToPeer;
  if (name == "read") return dma::Direction::FromPeer;
  return std::nullopt;
}

dma::WaitMode wait_mode(Wait wait) noexcept {
  switch (wait) {
    case Wait::fd:
      return dma::WaitMode::fd;
    case Wait::adaptive:
      return dma::WaitMode::adaptive;
    case Wait::busy:
      return dma::WaitMode::busy_poll;
  }
  return dma::WaitMode::fd;
}

Wait wait_of(dma::WaitMode mode) noexcept {
  switch (mode) {
    case dma::WaitMode::fd:
      return Wait::fd;
    case dma::WaitMode::adaptive:
      return Wait::adaptive;
    case dma::WaitMode::busy_poll:
      return Wait::busy;
  }
  return Wait::fd;
}

std::optional<std::size_t> parse_size(std::string_view text) noexcept {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data()) return std::nullopt;
  const std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  if (unit == "K" || unit == "KiB") shift = 10;
  if (unit == "M" || unit == "MiB") shift = 20;
  if (unit == "G" || unit == "GiB") shift = 30;
  constexpr std::uint64_t limit = std::uint64_t{1} << 30;
  if (shift < 0 || value == 0 || value > (limit >> shift)) return std::nullopt;
  return static_cast<std::size_t>(value << shift);
}

std::string size_text(std::size_t bytes) {
  if (bytes >= (1u << 30) && bytes % (1u << 30) == 0) return std::to_string(bytes >> 30) + "G";
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

}  // namespace bench
