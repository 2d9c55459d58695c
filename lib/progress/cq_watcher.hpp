// The CQ watcher: drains a completion queue and decides how the next look at it happens (a
// polling pass, the wait fd, or the backstop timer), by the WaitPolicy. The engine and Target use
// it alike; each runs it under its own serialisation (the engine's strand, the Target's mutex).
//
// The watcher never calls its host from inside one of its own calls. Its asynchronous waits call
// host->on_cq_event(event), with the host kept alive by the shared_ptr the wait holds; the host
// then takes its serialisation and calls accept(event) before anything else. A cancelled wait
// calls nothing: release() and detach() drop the flags at once, so a cancelled handler that runs
// after a re-arm cannot clear the new arm's flag.
#pragma once

#include "counter.hpp"
#include "hints.hpp"
#include "log.hpp"
#include "wait_policy.hpp"

#include <dma/configuration.hpp>
#include <dma/detail/block_pool.hpp>
#include <dma/metrics.hpp>

#include <asio/bind_allocator.hpp>
#include <asio/error.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <poll.h>

#include <algorithm>
#include <concepts>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dma::detail {

/// The watcher's counters (Metrics fields of the same names).
struct CqCounters {
  Counter cq_reads, fd_wakeups, spin_hits, armed_late, backstop_hits, queue_errors;

  /// Copies them into their Metrics fields (queue_errors adds to what is there).
  void report(Metrics& m) const noexcept {
    m.cq_reads = cq_reads.get();
    m.fd_wakeups = fd_wakeups.get();
    m.spin_hits = spin_hits.get();
    m.armed_late = armed_late.get();
    m.backstop_hits = backstop_hits.get();
    m.queue_errors += queue_errors.get();
  }
};

/// What a drained completion is, for a host that batches: another completion of the same drain
/// follows it, or it is the drain's last (or an error entry, which ends a batch).
enum class DrainPlace : std::uint8_t { more, last };

/// What woke the host: the fd, a polling pass, the backstop timer.
enum class CqEvent : std::uint8_t { wake, poll, backstop };
/// What CqWatcher::wait() did. armed: the fd wait was armed just now, and the host reads the CQ
/// once more: an edge that fired between fi_trywait and the arm is lost to an epoll reactor (which
/// registers the descriptor edge-triggered), and that read catches whatever it announced.
enum class CqWaited : std::uint8_t { polling, armed, already_armed, backstop };

/// What a sink receives for a successful entry: the op_context for fi_cq_entry
/// (FI_CQ_FORMAT_CONTEXT), the whole entry otherwise (fi_cq_data_entry, FI_CQ_FORMAT_DATA).
template <typename Entry>
using CqDelivered = std::conditional_t<std::is_same_v<Entry, fi_cq_entry>, void*, const Entry&>;

/// Where CqWatcher::read_some() hands entries: completed(delivered, place) for each successful one,
/// failed(cq, entry) for an error entry, returning how many operations that finished (0 or 1).
template <typename Sink, typename Entry>
concept CqReadSink = requires(Sink& sink, CqDelivered<Entry> delivered, fid_cq* cq, const fi_cq_err_entry& error) {
  sink.completed(delivered, DrainPlace::more);
  { sink.failed(cq, error) } -> std::convertible_to<std::size_t>;
};

/// Where CqWatcher::drain() hands entries: a CqReadSink, and first_done() after the first
/// completion that follows each read, for a host that batches.
template <typename Sink, typename Entry>
concept CqDrainSink = CqReadSink<Sink, Entry> && requires(Sink& sink) {
  sink.first_done();
};

/// The host of the watcher's asynchronous waits, which call host->on_cq_event(event) with the host
/// kept alive by the shared_ptr the wait holds.
template <typename Host>
concept CqEventHost = requires(Host& host) {
  host.on_cq_event(CqEvent::wake);
};

/// Entry is the CQ's entry type: fi_cq_entry (FI_CQ_FORMAT_CONTEXT), whose sinks receive the
/// op_context, or fi_cq_data_entry (FI_CQ_FORMAT_DATA), whose sinks receive the whole entry.
template <typename Executor, typename Entry = fi_cq_entry>
class CqWatcher {
 public:
  using Clock = std::chrono::steady_clock;
  using Event = CqEvent;
  using Waited = CqWaited;

  CqWatcher(const Executor& executor, const Configuration& configuration, WaitPolicy::WithoutFd without_fd)
      : executor_(executor),
        backstop_(executor),
        policy_(progress_wait_mode(configuration), configuration.spin_budget, without_fd),
        interval_(configuration.backstop_interval),
        entries_(std::max<std::size_t>(1, configuration.cq_batch)) {}
  ~CqWatcher() { detach(); }
  CqWatcher(const CqWatcher&) = delete;
  CqWatcher& operator=(const CqWatcher&) = delete;

  /// Where it reports a failing fi_cq_read or fi_cq_readerr; must outlive the watcher.
  void set_log(const Log& log) noexcept { log_ = &log; }

  /// Watches cq of fabric, with its wait fd (-1 for none; libfabric owns it, the watcher never
  /// closes it). Replaces whatever it watched before.
  void attach(fid_fabric* fabric, fid_cq* cq, int wait_fd) {
    detach();
    fabric_ = fabric;
    cq_ = cq;
    if (wait_fd >= 0 && policy_.mode() != WaitMode::busy_poll) {
      descriptor_.emplace(executor_, wait_fd);
      fd_ = wait_fd;
    }
    policy_.set_fd(descriptor_.has_value());
  }

  /// Stops watching the fd: cancels its wait and releases the descriptor, before fi_close(cq).
  void detach() noexcept {
    wait_armed_ = false;
    if (descriptor_) {
      descriptor_->cancel();
      (void)descriptor_->release();
      descriptor_.reset();
    }
    fd_ = -1;
    policy_.set_fd(false);
  }

  /// Stops everything (shutdown): the fd and the backstop.
  void close() noexcept {
    detach();
    backstop_armed_ = false;
    backstop_.cancel();
  }

  /// Nothing is outstanding: cancels the backstop and the fd wait, so the executor holds nothing
  /// of the watcher and an io_context's run() can return.
  void release() noexcept {
    if (backstop_armed_) {
      backstop_armed_ = false;
      backstop_.cancel();
    }
    if (wait_armed_) {
      wait_armed_ = false;
      descriptor_->cancel();
    }
  }

  /// Reads cq (the watched one or another) until it is empty, cq_batch entries per fi_cq_read.
  /// sink.completed(context, place) (sink.completed(entry, place) for fi_cq_data_entry) runs for each successful entry
  /// and sink.first_done() after the first completion that follows each read; sink.failed(cq, entry) for each error
  /// entry, returning 1 when it finished an operation. The last entry of a full read is held until the next read says
  /// whether more follow. Never spins on -FI_EAVAIL: a failing fi_cq_readerr ends the drain. Returns how many
  /// operations it finished.
  template <CqDrainSink<Entry> Sink>
  std::size_t drain(fid_cq* cq, Sink& sink) {
    std::size_t finished = 0;
    Entry held{};
    bool holding = false;
    for (;;) {
      const ssize_t n = fi_cq_read(cq, entries_.data(), entries_.size());
      if (n > 0) {
        counters_.cq_reads.add();
        const auto count = static_cast<std::size_t>(n);
        bool first = true;
        auto deliver = [&](const Entry& entry, DrainPlace place) {
          hand(sink, entry, place);
          if (std::exchange(first, false)) sink.first_done();
        };
        if (std::exchange(holding, false)) deliver(held, DrainPlace::more);
        for (std::size_t i = 0; i + 1 < count; ++i)
          deliver(entries_[i], DrainPlace::more);
        finished += count;
        if (count < entries_.size()) {
          deliver(entries_[count - 1], DrainPlace::last);
          return finished;
        }
        held = entries_[count - 1];
        holding = true;
        continue;
      }
      if (n == -FI_EAVAIL) {
        if (std::exchange(holding, false)) hand(sink, held, DrainPlace::more);
        fi_cq_err_entry entry{};
        if (const ssize_t rc = fi_cq_readerr(cq, &entry, 0); rc <= 0) {
          queue_failed("fi_cq_readerr", rc);
          return finished;
        }
        finished += static_cast<std::size_t>(sink.failed(cq, entry));
        continue;
      }
      if (holding) hand(sink, held, DrainPlace::last);
      if (n != -FI_EAGAIN) queue_failed("fi_cq_read", n);
      return finished;
    }
  }

  /// What read_some() found.
  struct Read {
    std::size_t taken = 0;  ///< successful entries handed to the sink
    bool drained = false;   ///< the CQ had nothing more (or failed): no entry is left behind
  };

  /// One fi_cq_read of at most `limit` entries (and at most cq_batch), for a host that must not
  /// take more than it can keep: every successful entry goes to sink.completed(entry,
  /// DrainPlace::more). A limit of 0 takes none: on a provider whose CQ is libfabric's util CQ
  /// (tcp, shm) that still makes progress, and reports whether entries are held. An error entry
  /// goes to sink.failed(cq, entry).
  template <CqReadSink<Entry> Sink>
  Read read_some(fid_cq* cq, Sink& sink, std::size_t limit) {
    const std::size_t asked = std::min(limit, entries_.size());
    const ssize_t n = fi_cq_read(cq, entries_.data(), asked);
    if (n > 0) {
      counters_.cq_reads.add();
      const auto count = static_cast<std::size_t>(n);
      for (std::size_t i = 0; i < count; ++i)
        hand(sink, entries_[i], DrainPlace::more);
      return {count, count < asked};
    }
    if (n == 0) return {0, false};
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry entry{};
      if (const ssize_t rc = fi_cq_readerr(cq, &entry, 0); rc <= 0) {
        queue_failed("fi_cq_readerr", rc);
        return {0, true};
      }
      (void)sink.failed(cq, entry);
      return {0, false};
    }
    if (n != -FI_EAGAIN) queue_failed("fi_cq_read", n);
    return {0, true};
  }

  /// After a pass, as the policy says: posts a polling pass, arms the fd (fi_trywait first), or
  /// leaves it to the backstop. fi_trywait reporting work counts as activity and polls.
  template <CqEventHost Host>
  Waited wait(const std::shared_ptr<Host>& host, bool poll_again) {
    switch (policy_.after_pass(poll_again)) {
      case WaitPolicy::Next::poll:
        schedule_poll(host);
        return Waited::polling;
      case WaitPolicy::Next::backstop:
        return Waited::backstop;
      case WaitPolicy::Next::arm:
        break;
    }
    if (wait_armed_) return Waited::already_armed;
    if (try_arm(host)) return Waited::armed;
    policy_.note_activity();
    schedule_poll(host);
    return Waited::polling;
  }

  /// fi_trywait, then one async_wait on the fd; false without an fd or when the provider says not
  /// to wait. The call is mandatory, not an optimisation: tcp updates its epoll interest inside it.
  template <CqEventHost Host>
  bool try_arm(const std::shared_ptr<Host>& host) {
    if (wait_armed_) return true;
    if (!descriptor_) return false;
    fid* fids[] = {&cq_->fid};
    if (fi_trywait(fabric_, fids, 1) != 0) return false;
    wait_armed_ = true;
    armed_at_ = Clock::now();
    descriptor_->async_wait(asio::posix::descriptor_base::wait_read, [host](std::error_code ec) {
      if (ec != asio::error::operation_aborted) host->on_cq_event(Event::wake);
    });
    return true;
  }

  /// One polling pass at a time, each a handler of its own.
  template <CqEventHost Host>
  void schedule_poll(const std::shared_ptr<Host>& host) {
    if (poll_scheduled_) return;
    poll_scheduled_ = true;
    asio::post(executor_, asio::bind_allocator(PoolAllocator<void>(), [host] { host->on_cq_event(Event::poll); }));
  }

  /// Arms the backstop for the configured backstop_interval unless it is armed already.
  template <CqEventHost Host>
  void arm_backstop(const std::shared_ptr<Host>& host) {
    arm_backstop(interval_, host);
  }
  /// Arms the backstop for interval unless it is armed already.
  template <CqEventHost Host>
  void arm_backstop(std::chrono::nanoseconds interval, const std::shared_ptr<Host>& host) {
    if (backstop_armed_) return;
    backstop_armed_ = true;
    backstop_.expires_after(interval);
    backstop_.async_wait([host](std::error_code ec) {
      if (ec != asio::error::operation_aborted) host->on_cq_event(Event::backstop);
    });
  }

  /// The first call of the host's on_cq_event, under its serialisation: settles the watcher's
  /// state for the event. For the backstop, it also notes whether a wake-up looks lost: the fd
  /// wait was armed for a whole backstop_interval and the fd is silent (completions found sooner, or while
  /// the fd is readable, were merely beaten to it by the timer); see backstop_found().
  void accept(Event event) noexcept {
    switch (event) {
      case Event::wake:
        wait_armed_ = false;
        counters_.fd_wakeups.add();
        policy_.note_activity();
        return;
      case Event::poll:
        poll_scheduled_ = false;
        return;
      case Event::backstop:
        backstop_armed_ = false;
        lost_wake_ = wait_armed_ && Clock::now() - armed_at_ >= interval_ && !fd_readable();
        return;
    }
  }

  /// The backstop's pass found completions: counted as a lost wake-up when accept() suspected one.
  void backstop_found() noexcept {
    if (lost_wake_) counters_.backstop_hits.add();
  }
  /// A polling pass found completions.
  void poll_found() noexcept { counters_.spin_hits.add(); }
  /// The read right after arming found completions.
  void armed_late_found() noexcept { counters_.armed_late.add(); }
  void note_activity() noexcept { policy_.note_activity(); }

  bool wait_armed() const noexcept { return wait_armed_; }
  bool has_fd() const noexcept { return descriptor_.has_value(); }
  const CqCounters& counters() const noexcept { return counters_; }

 private:
  // Counted always, logged at the 1st, 2nd, 4th, … time: a broken queue fails every drain.
  void queue_failed(const char* call, ssize_t rc) {
    counters_.queue_errors.add();
    const std::uint64_t count = counters_.queue_errors.get();
    if (!log_occurrence(count)) return;
    (*log_)(LogLevel::error, [&] {
      return std::string(call) + " failed: " + fi_strerror(static_cast<int>(rc < 0 ? -rc : rc)) +
             " (rc=" + std::to_string(rc) + "); " + std::to_string(count) + " queue errors so far";
    });
  }

  static inline const Log default_log_{};

  template <CqReadSink<Entry> Sink>
  static void hand(Sink& sink, const Entry& entry, DrainPlace place) {
    if constexpr (std::is_same_v<Entry, fi_cq_entry>) {
      sink.completed(entry.op_context, place);
    } else {
      sink.completed(entry, place);
    }
  }

  bool fd_readable() const noexcept {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  using Descriptor = asio::posix::basic_stream_descriptor<Executor>;
  using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, Executor>;

  Executor executor_;
  std::optional<Descriptor> descriptor_;
  Timer backstop_;
  WaitPolicy policy_;
  std::chrono::nanoseconds interval_;
  std::vector<Entry> entries_;
  fid_fabric* fabric_ = nullptr;
  fid_cq* cq_ = nullptr;
  int fd_ = -1;
  Clock::time_point armed_at_{};
  bool wait_armed_ = false;
  bool poll_scheduled_ = false;
  bool backstop_armed_ = false;
  bool lost_wake_ = false;
  CqCounters counters_;
  const Log* log_ = &default_log_;
};

}  // namespace dma::detail
