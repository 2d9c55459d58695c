#include "dma/target.hpp"

#include "dma/error.hpp"
#include "hints.hpp"

#include "cq_error.hpp"
#include "cq_watcher.hpp"
#include "log.hpp"
#include "notification_queue.hpp"
#include "random_key.hpp"
#include "target_receives.hpp"

#include <asio/bind_allocator.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>

#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <atomic>
#include <mutex>

namespace dma {
namespace {

std::uint64_t access_bits(Target::Access access) {
  switch (access) {
    case Target::Access::read:
      return FI_REMOTE_READ;
    case Target::Access::write:
      return FI_REMOTE_WRITE;
    case Target::Access::read_write:
      break;
  }
  return FI_REMOTE_READ | FI_REMOTE_WRITE;
}

// A waiter's completion posted to the Target's executor: frees the waiter unrun if the executor
// drops it.
struct PostedCompletion {
  PostedCompletion(detail::NotificationWaiter* w, std::error_code e) noexcept : waiter(w), ec(e) {}
  PostedCompletion(PostedCompletion&& other) noexcept : waiter(std::exchange(other.waiter, nullptr)), ec(other.ec) {}
  PostedCompletion(const PostedCompletion&) = delete;
  PostedCompletion& operator=(const PostedCompletion&) = delete;
  PostedCompletion& operator=(PostedCompletion&&) = delete;
  ~PostedCompletion() {
    if (waiter != nullptr) waiter->destroy(waiter);
  }
  void operator()() {
    detail::NotificationWaiter* w = std::exchange(waiter, nullptr);
    w->complete(w, ec, WriteNotification{});
  }
  detail::NotificationWaiter* waiter;
  std::error_code ec;
};

std::size_t checked_queue_capacity(const Configuration& configuration) {
  if (configuration.notification_queue == 0 || configuration.notification_queue > (std::size_t{1} << 20)) {
    throw std::system_error(errc::invalid_configuration, "notification_queue must be 1 to 1048576, not " +
                                                             std::to_string(configuration.notification_queue));
  }
  return configuration.notification_queue;
}

// Whether the provider keeps completions the Target leaves unread, and goes on making progress
// when asked for none: libfabric's util CQ (tcp, rxm and shm build on it) keeps every entry that
// does not fit its ring on an overflow list, and fi_cq_read with a count of 0 runs progress and
// says whether entries wait (docs/notes/immediate-data.md). Elsewhere (efa's device CQ) an unread
// CQ overruns, so the Target reads everything and drops what its queue cannot take.
bool provider_holds_unread_entries(const std::string& provider) {
  return provider.rfind("tcp", 0) == 0 || provider.rfind("shm", 0) == 0;
}

// How long the provider holds notifications while the queue is full: until the consumer has taken
// none for hold_while_stalled, or the provider has not been empty for hold_backlog. A consumer
// that keeps up never comes near either; one that stopped, or has fallen behind for good, would otherwise make the
// provider's memory grow (about 114 bytes per held entry on 1.17) without bound.
constexpr std::chrono::milliseconds hold_while_stalled{1000};
constexpr std::chrono::milliseconds hold_backlog{10'000};
// While holding, progress runs on a timer at this interval (the CQ cannot be waited on: it is not
// empty), so other peers' writes and reads to this Target keep moving.
constexpr std::chrono::microseconds held_progress_interval{1000};

}  // namespace

// Everything libfabric is touched under `mutex` (the endpoint is FI_THREAD_DOMAIN): the progress
// handlers on the executor and expose/withdraw from any thread. The notification queue and the
// waiters are kept under it too; waiters and the callback run outside it, one delivery at a time.
struct Target::State : std::enable_shared_from_this<State> {
  using Watcher = detail::CqWatcher<executor_type, fi_cq_data_entry>;
  using Clock = std::chrono::steady_clock;
  using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, executor_type>;

  State(const executor_type& executor, const Configuration& configuration)
      : executor(executor),
        log(configuration.log_handler),
        watcher(executor, configuration, detail::WaitPolicy::WithoutFd::backstop),
        held_progress(executor),
        queue(checked_queue_capacity(configuration)) {
    watcher.set_log(log);
  }

  void start() {
    holds = provider_holds_unread_entries(endpoint.describe().provider);
    watcher.attach(endpoint.fabric(), endpoint.cq(), endpoint.wait_fd());
    asio::post(executor, [self = shared_from_this()] { self->on_cq_event(detail::CqEvent::wake); });
  }

  // A passive target sees no completions of its own, so its only sign of traffic is the wait fd: a
  // wake-up (or fi_trywait saying work is pending) starts an adaptive spin. The spin matters to the
  // initiator as much as to the target: data arriving at a target that is still polling needs no
  // wake-up, and over loopback the initiator's sendmsg pays for each one.
  void on_cq_event(detail::CqEvent event) {
    std::unique_lock lock(mutex);
    if (stopped) return;
    watcher.accept(event);
    pass(lock);
  }

  void on_held_progress() {
    std::unique_lock lock(mutex);
    if (stopped) return;
    held_progress_armed = false;
    pass(lock);
  }

  // One progress pass: reads the CQ (which is what moves tcp's manual progress), handing each
  // batch to a waiting consumer before reading the next, so a consumer that keeps up drains the
  // queue during a burst. Then, unless the provider is holding entries, waits as the policy says.
  void pass(std::unique_lock<std::mutex>& lock) {
    passes.fetch_add(1, std::memory_order_relaxed);
    read_and_deliver(lock);
    if (stopped) return;
    watcher.arm_backstop(shared_from_this());
    if (held) {
      arm_held_progress();
    } else if (watcher.wait(shared_from_this(), false) == detail::CqWaited::armed) {
      read_and_deliver(lock);
      if (held) arm_held_progress();
    }
    if (!queue.ready() || !has_consumer()) return;
    lock.unlock();
    deliver();
  }

  // Reads batches no larger than the queue's free room while the provider can hold the rest, so
  // nothing is dropped: a full queue leaves the entries in the provider (`held`) until a consumer
  // takes from the queue, which starts another pass. Past the hold limits, or on a provider that
  // cannot hold, it reads everything and the queue drops and counts what does not fit.
  void read_and_deliver(std::unique_lock<std::mutex>& lock) {
    const auto now = Clock::now();
    if (held && !overflowing &&
        (now - std::max(held_since, last_taken) >= hold_while_stalled || now - held_since >= hold_backlog)) {
      overflowing = true;
      // Logged at the 1st, 2nd, 4th, … time: a Target nobody consumes from overflows every second.
      if (detail::log_occurrence(++overflow_episodes)) {
        log(LogLevel::warning, [&] {
          return "target notification queue full (" + std::to_string(queue.capacity()) + " entries) and " +
                 (now - held_since >= hold_backlog ? std::string("the oldest held notification waited 10 s")
                                                   : std::string("none taken for 1 s")) +
                 ": dropping what does not fit; " + std::to_string(queue.overflows()) + " lost before, " +
                 std::to_string(overflow_episodes) + " such times so far";
        });
      }
    }
    Sink sink{*this};
    for (;;) {
      const bool keep = holds && !overflowing;
      const std::size_t room = keep ? queue.capacity() - queue.size() : std::size_t(-1);
      const auto read = watcher.read_some(endpoint.cq(), sink, room);
      if (read.drained) {
        held = false;
        overflowing = false;
        break;
      }
      if (room == 0) {
        if (!held) held_since = now;
        held = true;
        break;
      }
      if (read.taken != 0 && queue.ready() && has_consumer() && !delivering) {
        lock.unlock();
        deliver();
        lock.lock();
        if (stopped) return;
      }
    }
  }

  bool has_consumer() const noexcept { return waiters != nullptr || callback; }

  void arm_held_progress() {
    if (held_progress_armed) return;
    held_progress_armed = true;
    held_progress.expires_after(held_progress_interval);
    held_progress.async_wait(
        asio::bind_allocator(detail::PoolAllocator<void>(), [self = shared_from_this()](std::error_code ec) {
          if (ec != asio::error::operation_aborted) self->on_held_progress();
        }));
  }

  // The target posts nothing of its own: its entries are peers' writes with immediate data, which
  // go to the notification queue; errors are logged (at the 1st, 2nd, 4th, … one: a misbehaving
  // initiator may cause many).
  struct Sink {
    State& state;
    void completed(const fi_cq_data_entry& entry, detail::DrainPlace) noexcept {
      if (!state.receives.notifies(entry)) return;
      (void)state.queue.push({entry.data, entry.len, entry.flags});
    }
    void first_done() noexcept {}
    int failed(fid_cq* cq, const fi_cq_err_entry& entry) noexcept {
      if (state.receives.owns_error(entry)) return 0;
      if (!detail::log_occurrence(++state.errors)) return 0;
      state.log(LogLevel::warning, [&] {
        return "target completion error: " + detail::error_detail(cq, entry, true) + "; " +
               std::to_string(state.errors) + " so far";
      });
      return 0;
    }
  };

  // Hands queued notifications to waiters, then to the callback, outside the lock. One thread
  // delivers at a time, which keeps the order; another that finds it busy leaves the work to it.
  void deliver() {
    std::unique_lock lock(mutex);
    if (delivering) return;
    delivering = true;
    struct Done {
      State& state;
      std::unique_lock<std::mutex>& lock;
      ~Done() {
        if (!lock.owns_lock()) lock.lock();
        state.delivering = false;
      }
    } done{*this, lock};
    while (!stopped && queue.ready() && (waiters != nullptr || callback)) {
      detail::Notification taken;
      std::uint64_t lost = 0;
      std::error_code ec;
      WriteNotification out;
      if (queue.pop(taken, lost) == detail::NotificationQueue::Popped::lost) {
        ec = errc::notifications_lost;
        out.data = lost;
      } else {
        out.data = taken.data;
        if (taken.length != 0) out.length = taken.length;
      }
      detail::NotificationWaiter* waiter = pop_waiter();
      std::shared_ptr<const NotificationCallback> call = waiter == nullptr ? callback : nullptr;
      took_one();
      lock.unlock();
      if (waiter != nullptr) {
        waiter->complete(waiter, ec, out);
      } else {
        (*call)(ec, out);
      }
      lock.lock();
    }
  }

  // A consumer took a notification: the hold's clock starts again, and a queue that was full has
  // room, so reading resumes.
  void took_one() {
    last_taken = Clock::now();
    if (!held) return;
    if (held_progress_armed) {
      held_progress_armed = false;
      held_progress.cancel();
    }
    watcher.schedule_poll(shared_from_this());
  }

  detail::NotificationWaiter* pop_waiter() noexcept {
    detail::NotificationWaiter* w = waiters;
    if (w != nullptr) unlink(w);
    return w;
  }
  void unlink(detail::NotificationWaiter* w) noexcept {
    if (w->prev != nullptr) {
      w->prev->next = w->next;
    } else {
      waiters = w->next;
    }
    if (w->next != nullptr) {
      w->next->prev = w->prev;
    } else {
      last_waiter = w->prev;
    }
    w->next = w->prev = nullptr;
  }
  void append(detail::NotificationWaiter* w) noexcept {
    w->prev = last_waiter;
    w->next = nullptr;
    if (last_waiter != nullptr) {
      last_waiter->next = w;
    } else {
      waiters = w;
    }
    last_waiter = w;
  }

  void post_completion(detail::NotificationWaiter* w, std::error_code ec) {
    asio::post(executor, asio::bind_allocator(detail::PoolAllocator<void>(), PostedCompletion(w, ec)));
  }
  void post_deliver() {
    asio::post(executor,
               asio::bind_allocator(detail::PoolAllocator<void>(), [self = shared_from_this()] { self->deliver(); }));
  }

  void stop() {
    detail::NotificationWaiter* pending = nullptr;
    {
      std::lock_guard lock(mutex);
      stopped = true;
      watcher.close();
      held_progress.cancel();
      pending = std::exchange(waiters, nullptr);
      last_waiter = nullptr;
    }
    while (pending != nullptr) {
      detail::NotificationWaiter* w = std::exchange(pending, pending->next);
      w->next = w->prev = nullptr;
      post_completion(w, asio::error::operation_aborted);
    }
  }

  executor_type executor;
  mutable std::mutex mutex;
  Endpoint endpoint;
  detail::TargetReceives receives;  // where writes with immediate data consume posted receives
  detail::Log log;
  Watcher watcher;
  std::uint64_t errors = 0;
  Timer held_progress;
  detail::NotificationQueue queue;
  bool holds = false;                // the provider keeps what the Target leaves unread
  bool held = false;                 // the queue was full and the provider has entries for it
  bool overflowing = false;          // past the hold limits: reading all, dropping what does not fit
  bool held_progress_armed = false;  // a timer pass is due while entries are held
  Clock::time_point held_since{};    // when the provider began holding entries
  std::uint64_t overflow_episodes = 0;
  Clock::time_point last_taken{};                 // when a consumer last took a notification
  detail::NotificationWaiter* waiters = nullptr;  // oldest first
  detail::NotificationWaiter* last_waiter = nullptr;
  std::shared_ptr<const NotificationCallback> callback;
  bool delivering = false;
  bool stopped = false;
  std::atomic<std::uint64_t> passes{0};
  std::atomic<std::uint64_t> waiter_ids{0};
};

Target::Target(const executor_type& executor, const Configuration& configuration)
    : state_(std::make_shared<State>(executor, configuration)) {
  state_->endpoint.open(configuration, Endpoint::CqFormat::data);
  std::error_code ec;
  state_->receives.open(state_->endpoint, ec);
  throw_if(ec, "posting the receives for writes with immediate data");
  state_->start();
}

// Stopping may fail only to allocate a waiter's completion or to lock a mutex; a destructor cannot
// report either, and dropping the completion would leave a waiter hanging, so that terminates.
Target::~Target() {  // NOLINT(bugprone-exception-escape)
  if (state_) state_->stop();
}

Target::Region Target::expose(std::span<std::byte> buffer, Access access) {
  std::error_code ec;
  Region region = expose(buffer, access, ec);
  if (ec && ec.category() == std::system_category()) throw std::system_error(ec, "getrandom for a remote key");
  if (ec) throw std::system_error(ec, "fi_mr_reg of " + std::to_string(buffer.size()) + " bytes for remote access");
  return region;
}

Target::Region Target::expose(std::span<std::byte> buffer, Access access, std::error_code& ec) {
  ec.clear();
  if (buffer.empty()) {
    ec = errc::zero_length_region;
    return {};
  }
  std::lock_guard lock(state_->mutex);
  Endpoint& endpoint = state_->endpoint;
  const bool provider_keys = (endpoint.describe().mr_mode & FI_MR_PROV_KEY) != 0;
  detail::Fid<fid_mr> mr;
  // Keys from the OS's random source make a guessed rkey useless, and no peer's keys tell it
  // another's; a duplicate (-FI_ENOKEY) just draws again.
  for (int attempt = 0; attempt < 8; ++attempt) {
    ec.clear();
    const std::uint64_t key = provider_keys ? 0 : detail::random_key(ec);
    if (ec) return {};
    mr = endpoint.register_memory(buffer.data(), buffer.size(), access_bits(access), key, ec);
    if (ec != fabric_error(-FI_ENOKEY)) break;
  }
  if (ec) return {};
  Region region;
  region.advertisement_.address = endpoint.local_address();
  region.advertisement_.remote_key = fi_mr_key(mr.get());
  region.advertisement_.remote_address =
      endpoint.uses_virtual_addressing() ? reinterpret_cast<std::uintptr_t>(buffer.data()) : 0;
  region.bytes_ = buffer;
  region.mr_ = mr.release();
  region.state_ = state_;
  return region;
}

void Target::insert_initiator(std::span<const std::uint8_t> address) {
  std::error_code ec;
  insert_initiator(address, ec);
  throw_if(ec, "inserting the initiator's " + std::to_string(address.size()) + "-byte address");
}

void Target::insert_initiator(std::span<const std::uint8_t> address, std::error_code& ec) {
  ec = validate_address(address, state_->endpoint.addr_format());
  if (ec) return;
  std::lock_guard lock(state_->mutex);
  (void)state_->endpoint.insert_address(address, ec);
}

std::span<const std::uint8_t> Target::local_address() const noexcept { return state_->endpoint.local_address(); }
EndpointInfo Target::describe() const { return state_->endpoint.describe(); }
Target::executor_type Target::get_executor() const noexcept { return state_->executor; }
std::uint64_t Target::progress_passes() const noexcept { return state_->passes.load(std::memory_order_relaxed); }

std::uint64_t Target::next_waiter_id() noexcept {
  return state_->waiter_ids.fetch_add(1, std::memory_order_relaxed) + 1;
}

void Target::start_wait(detail::NotificationWaiter* waiter) {
  State& state = *state_;
  std::unique_lock lock(state.mutex);
  if (state.stopped) {
    lock.unlock();
    return state.post_completion(waiter, asio::error::operation_aborted);
  }
  state.append(waiter);
  const bool ready = state.queue.ready() && !state.delivering;
  lock.unlock();
  if (ready) state.post_deliver();  // never inline: the handler must not run inside the initiation
}

void Target::cancel_wait(const std::shared_ptr<State>& state, std::uint64_t id) {
  std::unique_lock lock(state->mutex);
  detail::NotificationWaiter* w = state->waiters;
  while (w != nullptr && w->id != id)
    w = w->next;
  if (w == nullptr) return;  // already completed
  state->unlink(w);
  lock.unlock();
  state->post_completion(w, asio::error::operation_aborted);
}

void Target::set_notification_callback(NotificationCallback callback) {
  auto shared = callback ? std::make_shared<const NotificationCallback>(std::move(callback)) : nullptr;
  bool ready = false;
  {
    std::lock_guard lock(state_->mutex);
    state_->callback = std::move(shared);
    ready = state_->callback && state_->queue.ready() && !state_->delivering;
  }
  if (ready) state_->post_deliver();
}

std::uint64_t Target::notifications_lost() const {
  std::lock_guard lock(state_->mutex);
  return state_->queue.overflows();
}

std::size_t Target::notifications_queued() const {
  std::lock_guard lock(state_->mutex);
  return state_->queue.size();
}

Target::Region::Region() noexcept = default;
Target::Region::Region(Region&& other) noexcept
    : state_(std::move(other.state_)),
      mr_(std::exchange(other.mr_, nullptr)),
      bytes_(other.bytes_),
      advertisement_(std::move(other.advertisement_)) {}

Target::Region& Target::Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    Region discard(std::move(*this));
    state_ = std::move(other.state_);
    mr_ = std::exchange(other.mr_, nullptr);
    bytes_ = other.bytes_;
    advertisement_ = std::move(other.advertisement_);
  }
  return *this;
}

Target::Region::~Region() {
  if (state_ == nullptr || mr_ == nullptr) return;
  std::lock_guard lock(state_->mutex);
  detail::Fid<fid_mr> closing(static_cast<fid_mr*>(mr_));
}

}  // namespace dma
