/// @file
/// dma::TargetThread: a Target progressed on a thread of its own, for programs that have no
/// io_context to give it (the mirror of FabricService::start for the passive side).
#pragma once

#include <dma/configuration.hpp>
#include <dma/export.hpp>
#include <dma/target.hpp>

#include <sys/types.h>

#include <memory>
#include <span>
#include <string>
#include <system_error>

namespace dma {

/// A Target on an io_context of its own, run by one thread (`target-NN`) from start() until the
/// TargetThread is destroyed. Every member function may be called from any thread; the
/// Target's own functions too (target()), as the Target allows.
///
/// Regions the Target exposed may outlive the TargetThread: they keep the endpoint open, but
/// nothing progresses it any more, so over tcp a peer's transfers to them stall until they fail.
class DMA_EXPORT TargetThread {
 public:
  /// How the thread runs.
  struct Options {
    int cpu = -1;      ///< bind the thread to this CPU (-1: wherever the scheduler puts it)
    std::string name;  ///< the thread's name, at most 15 bytes (empty: `target-NN`)
  };

  /// Opens the Target (Target's constructor: configuration.wait_mode says how it waits) and
  /// starts its thread; returns once the thread runs. Throws std::system_error: the Target's
  /// errors, or sched_setaffinity's for an unusable CPU.
  static std::unique_ptr<TargetThread> start(const Configuration& configuration, const Options& options);
  /// As start(configuration, Options()).
  static std::unique_ptr<TargetThread> start(const Configuration& configuration);
  /// As start() above; on failure sets ec, `detail` (when given) to what failed, and returns null.
  static std::unique_ptr<TargetThread> start(const Configuration& configuration, const Options& options,
                                             std::error_code& ec, std::string* detail = nullptr);

  /// Stops progress and joins the thread (pause()), then closes the Target.
  ~TargetThread();
  TargetThread(const TargetThread&) = delete;
  TargetThread& operator=(const TargetThread&) = delete;

  /// The Target. Its executor is this thread's io_context.
  Target& target() noexcept;
  /// As target().expose(buffer, access).
  Target::Region expose(std::span<std::byte> buffer, Target::Access access = Target::Access::read_write);
  /// The thread's kernel id, as /proc/self/task/ names it; 0 while paused.
  pid_t thread_id() const noexcept;
  /// Stops driving progress and joins the thread: a peer's transfers to the Target stay in flight
  /// (over tcp) until resume(), as with a peer that froze. Idempotent; not from the thread itself.
  void pause();
  /// Starts driving progress again on a new thread of the same name and CPU. Idempotent. Throws
  /// std::system_error as start() does.
  void resume();

 private:
  struct State;
  explicit TargetThread(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace dma
