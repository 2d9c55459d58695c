// The sink every part of the library logs through. Whether anyone listens at a level costs one
// load and a compare (the service's handler, or one relaxed atomic for the process-wide one), and
// a message is formatted only when someone does: pass the text as a function that builds it.
//
//   log_(LogLevel::warning, [&] { return "peer unreachable: " + detail; });
//
// Nothing logs on the success path of a transfer.
#pragma once

#include "dma/log.hpp"

#include <atomic>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

namespace dma::detail {

/// Above every level: the process-wide threshold while no process-wide handler is installed.
inline constexpr std::uint8_t log_off = 0xff;

/// The least level the process-wide handler takes, or log_off. Written by set_log_handler().
extern std::atomic<std::uint8_t> process_log_threshold;

inline bool process_log_enabled(LogLevel level) noexcept {
  return static_cast<std::uint8_t>(level) >= process_log_threshold.load(std::memory_order_relaxed);
}

/// Hands the message to the process-wide handler, if it takes that level (thread-safe).
void process_log(LogLevel level, std::string_view message) noexcept;

/// Whether the count-th occurrence of a recurring failure is logged: the 1st, 2nd, 4th, 8th, …
inline bool log_occurrence(std::uint64_t count) noexcept { return count != 0 && (count & (count - 1)) == 0; }

/// One service's (or target's, or endpoint's) log: its own handler when the configuration has one,
/// otherwise the process-wide one.
class Log {
 public:
  Log() = default;
  explicit Log(LogHandler handler) : handler_(std::move(handler)) {}

  bool enabled(LogLevel level) const noexcept {
    return handler_ ? handler_.enabled(level) : process_log_enabled(level);
  }

  /// Logs the text `format` gives: a string (or anything convertible to std::string_view), or a
  /// function returning one, called only when someone listens at `level`.
  template <typename Format>
  void operator()(LogLevel level, Format&& format) const noexcept {
    if (!enabled(level)) [[likely]]
      return;
    if constexpr (std::is_convertible_v<Format&&, std::string_view>) {
      write(level, std::string_view(format));
    } else {
      emit(level, std::forward<Format>(format));
    }
  }

 private:
  template <typename Format>
  [[gnu::cold, gnu::noinline]] void emit(LogLevel level, Format&& format) const noexcept {
    try {
      const auto text = std::forward<Format>(format)();
      write(level, std::string_view(text));
    } catch (...) {
      // Out of memory while formatting: the message is dropped, the engine goes on.
    }
  }

  void write(LogLevel level, std::string_view message) const noexcept;

  LogHandler handler_;
};

}  // namespace dma::detail
