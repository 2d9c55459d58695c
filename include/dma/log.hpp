/// @file
/// The logging hook: the library says what went wrong (a peer marked unreachable, a transfer past
/// its deadline, an endpoint replaced) through a function the application hands it, per service
/// or for the whole process. Without one the library is silent.
#pragma once

#include <dma/export.hpp>

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>

namespace dma {

/// How much a message matters, least first. A LogHandler receives the messages at or above its
/// threshold.
enum class LogLevel : std::uint8_t {
  debug,    ///< detail for whoever debugs the library or the fabric (an endpoint's attributes)
  info,     ///< a normal but notable event (an endpoint opened or replaced, a peer reconnected)
  warning,  ///< something failed and the library coped (a peer marked unreachable, a deadline)
  error,    ///< something failed that the library cannot repair (a completion queue error)
};

/// The level's name: "debug", "info", "warning" or "error".
DMA_EXPORT std::string_view to_string(LogLevel level) noexcept;

/// A function that receives the library's messages, and the least level it wants. Empty (the
/// default) means silent. Copies share one function object, and compare equal; handlers built
/// separately never do, even from the same lambda.
///
/// The function is called with the level and one line of text, without a trailing newline, e.g.
/// `peer unreachable: ...`. It must not block for long (it runs on a library thread, between
/// completions), and an exception it throws is dropped. Which threads call it, and when, depends
/// on where it is installed: see Configuration::log_handler and set_log_handler().
class DMA_EXPORT LogHandler {
 public:
  /// What the handler calls.
  using Function = std::function<void(LogLevel level, std::string_view message)>;

  /// A silent handler.
  LogHandler() noexcept = default;

  /// Calls `function` for every message at or above `threshold`. An empty std::function gives a
  /// silent handler.
  template <typename F>
  requires(!std::same_as<std::remove_cvref_t<F>, LogHandler> && std::invocable<F&, LogLevel, std::string_view>)
      // Implicit by design; the requires clause keeps LogHandler itself out.
      // NOLINTNEXTLINE(google-explicit-constructor,bugprone-forwarding-reference-overload)
      LogHandler(F&& function, LogLevel threshold = LogLevel::info)
      : threshold_(threshold) {
    Function wrapped(std::forward<F>(function));
    if (wrapped) function_ = std::make_shared<const Function>(std::move(wrapped));
  }

  /// Whether there is a function at all.
  explicit operator bool() const noexcept { return function_ != nullptr; }
  /// The least level passed on.
  LogLevel threshold() const noexcept { return threshold_; }
  /// Whether a message at `level` would be passed on.
  bool enabled(LogLevel level) const noexcept { return function_ != nullptr && level >= threshold_; }

  /// Passes the message on if enabled(level); drops an exception the function throws.
  void operator()(LogLevel level, std::string_view message) const noexcept;

  /// The same function object (or both silent) and the same threshold.
  friend bool operator==(const LogHandler&, const LogHandler&) noexcept = default;

 private:
  std::shared_ptr<const Function> function_;
  LogLevel threshold_ = LogLevel::info;
};

/// A handler that writes `dma-libfabric <level>: <message>` and a newline to stderr, one write
/// per message, for messages at or above `threshold`.
DMA_EXPORT LogHandler log_to_stderr(LogLevel threshold = LogLevel::info);

/// Installs the process-wide handler, which receives the messages of every service and target
/// whose Configuration::log_handler is empty, and returns the handler it replaces. An empty
/// handler makes them silent again (the default).
///
/// Thread safety: it may be called from any thread at any time, also while services log. The
/// handler it installs may be called from several threads at once (each service and target logs
/// from the thread that opens it and then from the threads that run its executor), so it must be
/// safe for that. When set_log_handler() returns, no thread is still inside a call of the handler
/// it replaced, and none will enter one; the replaced handler can then be destroyed along with
/// what it refers to. Called from inside a handler, it returns at once instead (the calling
/// handler's own call is still running; other threads may be finishing theirs).
DMA_EXPORT LogHandler set_log_handler(LogHandler handler);

}  // namespace dma
