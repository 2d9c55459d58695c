/// @file
/// dma::Target: the passive peer. It registers buffers for remote access, produces the
/// Advertisement a server needs, inserts an initiator's address where the provider demands it
/// (efa-direct), and drives progress on its executor (tcp's progress is manual: a target nobody
/// progresses stalls every server writing to it).
#pragma once

#include <dma/advertisement.hpp>
#include <dma/config.hpp>
#include <dma/configuration.hpp>
#include <dma/detail/block_pool.hpp>
#include <dma/detail/handler.hpp>
#include <dma/endpoint.hpp>
#include <dma/export.hpp>
#include <dma/notification.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_allocator.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/execution_context.hpp>
#include <asio/prefer.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <system_error>
#include <type_traits>
#include <utility>

namespace dma {
namespace detail {

/// A pending Target::async_wait_written, its handler's type erased.
struct NotificationWaiter {
  /// Frees the waiter, then runs its handler with (ec, notification) on the handler's executor.
  /// Called on the Target's executor, outside the Target's lock.
  void (*complete)(NotificationWaiter* waiter, std::error_code ec, const WriteNotification& notification) = nullptr;
  /// Frees the waiter without running its handler.
  void (*destroy)(NotificationWaiter* waiter) noexcept = nullptr;
  NotificationWaiter* next = nullptr;
  NotificationWaiter* prev = nullptr;
  std::uint64_t id = 0;  ///< what a cancellation names it by
};

/// The waiter of one handler, allocated with the handler's associated allocator (the library's
/// block pool by default).
template <typename Handler, typename IoExecutor>
struct NotificationWaiterFor final : NotificationWaiter {
  using HandlerExecutor = asio::associated_executor_t<Handler, IoExecutor>;
  using WorkExecutor = std::decay_t<decltype(asio::prefer(std::declval<const HandlerExecutor&>(),
                                                          asio::execution::outstanding_work.tracked))>;
  using Allocator = typename std::allocator_traits<
      asio::associated_allocator_t<Handler, PoolAllocator<void>>>::template rebind_alloc<NotificationWaiterFor>;

  NotificationWaiterFor(Handler&& handler_in, const IoExecutor& io_executor)
      : handler(std::move(handler_in)),
        work(asio::prefer(asio::get_associated_executor(handler, io_executor),
                          asio::execution::outstanding_work.tracked)) {
    complete = &run;
    destroy = &free;
  }

  static NotificationWaiterFor* create(Handler&& handler, const IoExecutor& io_executor) {
    Allocator allocator(asio::get_associated_allocator(handler, PoolAllocator<void>()));
    NotificationWaiterFor* waiter = std::allocator_traits<Allocator>::allocate(allocator, 1);
    try {
      std::allocator_traits<Allocator>::construct(allocator, waiter, std::move(handler), io_executor);
    } catch (...) {
      std::allocator_traits<Allocator>::deallocate(allocator, waiter, 1);
      throw;
    }
    return waiter;
  }

  static void free(NotificationWaiter* base) noexcept {
    auto* waiter = static_cast<NotificationWaiterFor*>(base);
    Allocator allocator(asio::get_associated_allocator(waiter->handler, PoolAllocator<void>()));
    std::allocator_traits<Allocator>::destroy(allocator, waiter);
    std::allocator_traits<Allocator>::deallocate(allocator, waiter, 1);
  }

  static void run(NotificationWaiter* base, std::error_code ec, const WriteNotification& notification) {
    auto* waiter = static_cast<NotificationWaiterFor*>(base);
    auto slot = asio::get_associated_cancellation_slot(waiter->handler);
    if (slot.is_connected()) slot.clear();
    Handler handler(std::move(waiter->handler));
    WorkExecutor executor(std::move(waiter->work));
    free(waiter);
    auto allocator = asio::get_associated_allocator(handler, PoolAllocator<void>());
    asio::dispatch(executor,
                   asio::bind_allocator(allocator, [handler = std::move(handler), ec, notification]() mutable {
                     std::move(handler)(ec, notification);
                   }));
  }

  Handler handler;
  WorkExecutor work;
};

}  // namespace detail

/// The passive peer: exposes buffers for the server to write into or read from, and drives the
/// progress that tcp needs on the target side. Every member function may be called from any
/// thread, concurrently (libfabric calls are serialised by the Target's mutex); the destructor
/// must not run concurrently with any of them.
class DMA_EXPORT Target {
  struct State;

 public:
  /// The executor progress runs on.
  using executor_type = asio::any_io_executor;
  /// The token async_wait_written() uses when the caller names none: asio::use_awaitable_t<>.
  using default_token_type = detail::default_token_t<executor_type>;

  /// What a peer may do to an exposed buffer.
  enum class Access {
    read,       ///< the server may read (FI_REMOTE_READ)
    write,      ///< the server may write (FI_REMOTE_WRITE)
    read_write  ///< both
  };

  /// One exposed buffer. Destroying it closes the registration: after that no peer can reach the
  /// buffer, and it may be freed. Move-only.
  class Region {
   public:
    /// An empty region: no registration.
    Region() noexcept;
    /// Takes over `other`'s registration; `other` becomes empty.
    Region(Region&& other) noexcept;
    /// Closes this region's registration, then takes over `other`'s.
    Region& operator=(Region&& other) noexcept;
    /// Closes the registration: from then on no peer can reach the buffer.
    ~Region();

    /// `<address-hex> <rkey> <remote-addr>` for this buffer on this target.
    const Advertisement& advertisement() const noexcept { return advertisement_; }
    /// The exposed buffer.
    std::span<std::byte> bytes() const noexcept { return bytes_; }
    /// False for an empty (default-constructed or moved-from) region.
    explicit operator bool() const noexcept { return state_ != nullptr; }

   private:
    friend class Target;
    std::shared_ptr<State> state_;
    void* mr_ = nullptr;
    std::span<std::byte> bytes_;
    Advertisement advertisement_;
  };

  /// Opens the endpoint and starts driving progress on executor. Throws std::system_error.
  /// configuration.wait_mode says how: `fd` waits on the CQ's wait fd between passes, `adaptive`
  /// (the default) keeps polling for spin_budget after each wake-up before it waits again (data
  /// that lands meanwhile needs no wake-up, which over loopback also saves the writer's CPU), and
  /// `busy_poll` never waits (a core per target). A backstop timer (backstop_interval) also ticks.
  Target(const executor_type& executor, const Configuration& configuration);
  /// As Target(context.get_executor(), configuration), e.g. with an asio::io_context.
  template <typename ExecutionContext>
  requires std::is_convertible_v<ExecutionContext&, asio::execution_context&> Target(ExecutionContext& context,
                                                                                     const Configuration& configuration)
      : Target(executor_type(context.get_executor()), configuration) {}
  /// Stops driving progress. Regions still alive keep the endpoint open until they go.
  ~Target();  // NOLINT(bugprone-exception-escape): see its definition
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  /// Registers buffer for remote access with a random 64-bit requested key (where the provider
  /// lets the application choose keys), drawn for this buffer alone from the OS's random source
  /// (getrandom), and returns its Region. The buffer must outlive the Region.
  /// Throws std::system_error (fi_mr_reg's error; getrandom's errno in the system category when
  /// the OS gives no random bytes; an empty buffer is errc::zero_length_region).
  Region expose(std::span<std::byte> buffer, Access access = Access::read_write);
  /// As expose(buffer, access), reporting a failure through `ec` and returning an empty Region.
  Region expose(std::span<std::byte> buffer, Access access, std::error_code& ec);

  /// Inserts an initiator's address into this target's AV. efa-direct requires this before the
  /// initiator can reach any region; tcp does not need it.
  /// Throws std::system_error: an invalid address (condition::invalid_advertisement) or
  /// fi_av_insert's error.
  void insert_initiator(std::span<const std::uint8_t> address);
  /// As insert_initiator(address), reporting a failure through `ec`.
  void insert_initiator(std::span<const std::uint8_t> address, std::error_code& ec);

  /// The target's fi_getname bytes: the address its advertisements carry.
  std::span<const std::uint8_t> local_address() const noexcept;
  /// What the target's endpoint ended up with.
  EndpointInfo describe() const;
  /// The executor progress runs on; it must keep running while any region is advertised.
  executor_type get_executor() const noexcept;
  /// Progress passes run so far (wake-ups, adaptive polls and backstop timer ticks).
  std::uint64_t progress_passes() const noexcept;

  /// The completion signature of async_wait_written.
  using wait_written_signature = void(std::error_code, WriteNotification);
  /// Waits for the next write with immediate data into any of this target's regions. Completes
  /// with the oldest queued notification, or, when none is queued, with the next one to arrive;
  /// with errc::notifications_lost (data: how many) where notifications were dropped (see
  /// notifications_lost()); with asio::error::operation_aborted when cancelled through the handler's
  /// cancellation slot or when the Target is destroyed. Waiters are served in the order they
  /// started. The handler never runs inside this call: it runs on its associated executor (by
  /// default the Target's), outside the Target's lock. Takes any Asio completion token.
  ///
  /// @par Completion Signature
  /// @code void(std::error_code, dma::WriteNotification) @endcode
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the wait ends with asio::error::operation_aborted and takes no
  /// notification; the next one goes to the next waiter or stays queued.
  template <asio::completion_token_for<wait_written_signature> CompletionToken = default_token_type>
  auto async_wait_written(CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, wait_written_signature>(initiate_wait{this}, token);
  }

  /// What a notification callback receives: as async_wait_written's handler.
  using NotificationCallback = std::function<wait_written_signature>;
  /// Hands every notification no async_wait_written waiter takes to `callback`, on the Target's
  /// executor, outside its lock, one at a time in order (pending waiters are served first). An
  /// empty function goes back to queueing them.
  void set_notification_callback(NotificationCallback callback);

  /// Notifications dropped so far because the queue (Configuration::notification_queue) was full
  /// and could not be held either: on tcp and shm the provider keeps what the full queue cannot
  /// until a consumer takes from it, and drops happen only once nothing was taken for 1 s or the
  /// oldest held notification has waited 10 s; elsewhere a full queue drops at once.
  std::uint64_t notifications_lost() const;
  /// Notifications queued now, waiting for a waiter or the callback.
  std::size_t notifications_queued() const;

 private:
  // The initiation carries the Target's executor (Asio's convention for initiations).
  struct initiate_wait {
    Target* self;
    using executor_type = Target::executor_type;
    executor_type get_executor() const noexcept { return self->get_executor(); }
    template <typename Handler>
    void operator()(Handler&& handler) const {
      using Waiter = detail::NotificationWaiterFor<std::decay_t<Handler>, executor_type>;
      Waiter* waiter = Waiter::create(std::decay_t<Handler>(std::forward<Handler>(handler)), get_executor());
      waiter->id = self->next_waiter_id();
      auto slot = asio::get_associated_cancellation_slot(waiter->handler);
      if (slot.is_connected()) slot.template emplace<WaitCanceller>(self->state_, waiter->id);
      self->start_wait(waiter);
    }
  };

  struct WaitCanceller {
    WaitCanceller(std::shared_ptr<State> s, std::uint64_t i) noexcept : state(std::move(s)), id(i) {}
    std::shared_ptr<State> state;
    std::uint64_t id;
    void operator()(asio::cancellation_type type) const {
      if (type != asio::cancellation_type::none) cancel_wait(state, id);
    }
  };
  std::uint64_t next_waiter_id() noexcept;
  void start_wait(detail::NotificationWaiter* waiter);
  static void cancel_wait(const std::shared_ptr<State>& state, std::uint64_t id);

  std::shared_ptr<State> state_;
};

}  // namespace dma
