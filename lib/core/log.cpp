#include "log.hpp"

#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <shared_mutex>
#include <string>

namespace dma {
namespace detail {

std::atomic<std::uint8_t> process_log_threshold{log_off};

namespace {

// The process-wide handler. A call copies the handler under `handler_mutex` and runs it holding
// `calls` shared; set_log_handler() swaps the handler, then takes `calls` exclusively once, which
// returns when every call of the old handler has. Never destroyed: services may still log while
// static objects are destroyed at exit.
struct ProcessLog {
  std::mutex handler_mutex;
  LogHandler handler;
  std::shared_mutex calls;
};

ProcessLog& process() {
  static ProcessLog* log = new ProcessLog;  // NOLINT(cppcoreguidelines-owning-memory): lives until exit
  return *log;
}

// Calls of the process-wide handler this thread is inside: a nested one (the handler logs through
// the library) must not take `calls` again, nor may set_log_handler() wait for it.
thread_local int handler_depth = 0;

LogHandler current_handler() {
  ProcessLog& log = process();
  std::lock_guard lock(log.handler_mutex);
  return log.handler;
}

}  // namespace

void process_log(LogLevel level, std::string_view message) noexcept {
  if (!process_log_enabled(level)) return;
  ProcessLog& log = process();
  std::shared_lock<std::shared_mutex> calls;
  if (handler_depth == 0) calls = std::shared_lock(log.calls);
  const LogHandler handler = current_handler();
  ++handler_depth;
  handler(level, message);
  --handler_depth;
}

void Log::write(LogLevel level, std::string_view message) const noexcept {
  if (handler_) {
    handler_(level, message);
  } else {
    process_log(level, message);
  }
}

}  // namespace detail

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warning:
      return "warning";
    case LogLevel::error:
      return "error";
  }
  return "unknown";
}

void LogHandler::operator()(LogLevel level, std::string_view message) const noexcept {
  if (!enabled(level)) return;
  try {
    (*function_)(level, message);
  } catch (...) {
    // The library logs from inside its completion path: a throwing handler must not break it.
  }
}

LogHandler log_to_stderr(LogLevel threshold) {
  return LogHandler(
      [](LogLevel level, std::string_view message) {
        std::string line = "dma-libfabric ";
        line += to_string(level);
        line += ": ";
        line += message;
        line += '\n';
        // One write per line, so lines from several threads do not interleave.
        std::size_t done = 0;
        while (done < line.size()) {
          const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) return;
          done += static_cast<std::size_t>(n);
        }
      },
      threshold);
}

LogHandler set_log_handler(LogHandler handler) {
  detail::ProcessLog& log = detail::process();
  LogHandler previous;
  {
    std::lock_guard lock(log.handler_mutex);
    previous = std::exchange(log.handler, std::move(handler));
    detail::process_log_threshold.store(
        log.handler ? static_cast<std::uint8_t>(log.handler.threshold()) : detail::log_off, std::memory_order_relaxed);
  }
  if (detail::handler_depth == 0) std::unique_lock wait_for_calls(log.calls);
  return previous;
}

}  // namespace dma
