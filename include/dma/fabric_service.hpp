// dma::FabricService<Context>: the Rust crate's callback API for code without Asio. A thin layer
// over asynchronous::FabricService: it runs the asynchronous service on its own io_context thread
// (`fabric-NN`) and hands completions to a BatchCompleter, one batch per completion-queue drain.
// Checksummed transfers are finished on a Pool so hashing never stalls the reaper.
#pragma once

#include <dma/asynchronous.hpp>
#include <dma/checksum.hpp>
#include <dma/config.hpp>
#include <dma/pool.hpp>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace dma {

/// Receives the completions of one completion-queue drain at a time. It runs on the service's
/// `fabric-NN` thread (plain batches) and on Pool threads (checksummed batches), possibly at the
/// same time: it must be thread-safe, quick, and must not throw. It may move the contexts out.
template <typename Context>
using BatchCompleter = std::function<void(std::span<Completion<Context>> batch)>;

namespace detail {

/// Process-wide numbering of fabric threads: fabric-00, fabric-01, ...
inline std::atomic<unsigned> fabric_thread_counter{0};

/// The caller's context plus the operand the library resolved from it, for the checksum. It
/// offers exactly the operand members the caller's context has, so it resolves as the context
/// would (detail::resolve_operand).
template <TransferContext Context>
struct Tracked {
  Context context;
  mutable std::span<const std::byte> operand;

  std::optional<std::span<const std::byte>> source() const requires requires(const Context& c) {
    Operands<Context>::source(c);
  }
  {
    auto bytes = Operands<Context>::source(context);
    if (bytes) operand = *bytes;
    return bytes;
  }
  std::optional<std::span<std::byte>> allocate(std::size_t length) requires requires(Context& c, std::size_t n) {
    Operands<Context>::allocate(c, n);
  }
  {
    auto bytes = Operands<Context>::allocate(context, length);
    if (bytes) operand = bytes->first(std::min(length, bytes->size()));
    return bytes;
  }
  std::optional<CacheableSpan> cacheable_span() const { return detail::cacheable_span(context); }
  std::optional<std::span<const std::span<const std::byte>>> sources() const requires requires(const Context& c) {
    Operands<Context>::sources(c);
  }
  { return Operands<Context>::sources(context); }
  std::optional<std::span<const std::span<std::byte>>> landing() requires requires(Context& c) {
    Operands<Context>::landing(c);
  }
  { return Operands<Context>::landing(context); }
  std::optional<std::span<const RemoteSegment>> remote_segments() const requires requires(const Context& c) {
    Operands<Context>::remote_segments(c);
  }
  { return Operands<Context>::remote_segments(context); }

  /// The caller asked for a CRC: one over a list of buffers is computed by the engine, as the
  /// transfer completes, since the Pool sees only a single operand.
  bool checksum_lists = false;
};

}  // namespace detail

/// The callback fabric service: its endpoint (or endpoints, Configuration::endpoints) on a thread
/// of its own (`fabric-NN`), whose completions reach a BatchCompleter in batches, with checksums
/// computed on a Pool. Built on asynchronous::FabricService. Public member functions may be called
/// from any thread, at the same time; the destructor must not run concurrently with any of them.
/// add_peer() and register_region() block until the fabric thread has run them, so neither they
/// nor the destructor may be called from the completer.
///
/// Context is the caller's per-transfer context; it supplies the operand (see dma::Operands) and
/// comes back by value in the Completion.
template <TransferContext Context>
class FabricService {
  using Inner = asynchronous::FabricService<detail::Tracked<Context>, asio::io_context::executor_type>;

 public:
  /// Opens the endpoint on a new `fabric-NN` thread and returns once it is ready. Throws
  /// std::system_error naming the step that failed.
  static std::unique_ptr<FabricService> start(const Configuration& configuration, BatchCompleter<Context> completer,
                                              std::shared_ptr<Pool> pool) {
    std::unique_ptr<FabricService> service(new FabricService(std::move(completer), std::move(pool)));
    service->inner_.open(configuration);
    service->deadline_ = configuration.progress_deadline;
    service->run();
    return service;
  }

  /// As start() above; on failure sets ec and returns null instead of throwing.
  static std::unique_ptr<FabricService> start(const Configuration& configuration, BatchCompleter<Context> completer,
                                              std::shared_ptr<Pool> pool, std::error_code& ec) {
    std::unique_ptr<FabricService> service(new FabricService(std::move(completer), std::move(pool)));
    service->inner_.open(configuration, ec);
    if (ec) return nullptr;
    service->deadline_ = configuration.progress_deadline;
    service->run();
    return service;
  }

  /// Transfers never posted fail with errc::shutdown; posted ones finish (bounded by the progress
  /// deadline). Then it waits until every accepted transfer has reached the completer, checksummed
  /// batches on the Pool included, for at most 2 * progress_deadline + 10 s. Past that bound (a
  /// completer that blocks, a Pool whose workers other jobs hold) it returns anyway, and a batch
  /// still queued on the Pool reaches the completer later, from the Pool.
  ~FabricService() {
    {
      std::lock_guard lock(submit_mutex_);
      running_ = false;
      inner_.close();
    }
    std::unique_lock lock(delivery_->mutex);
    delivery_->cv.wait_for(lock, 2 * deadline_ + std::chrono::seconds(10),
                           [&] { return delivery_->delivered == accepted_ && delivery_->pool_jobs == 0; });
    lock.unlock();
    work_.reset();
    if (thread_.joinable()) thread_.join();  // a start() that failed never started it
  }

  FabricService(const FabricService&) = delete;
  FabricService& operator=(const FabricService&) = delete;

  /// Queues one transfer without blocking. Returns the request back if the service is gone.
  std::optional<TransferRequest<Context>> submit(TransferRequest<Context> request) {
    std::lock_guard lock(submit_mutex_);
    if (!running_) return request;
    ++accepted_;
    TransferRequest<detail::Tracked<Context>> inner;
    static_cast<TransferFields&>(inner) = static_cast<const TransferFields&>(request);
    inner.want_checksum = false;  // hashed on the pool instead, off the reaper
    inner.caller_context.context = std::move(request.caller_context);
    inner.caller_context.checksum_lists = request.want_checksum;
    inner_.submit(std::move(inner), Handler{this, request.want_checksum});
    return std::nullopt;
  }

  /// Inserts a peer's address ahead of its first transfer (blocks for the round trip to the
  /// fabric thread). Throws std::system_error on an unusable address.
  void add_peer(std::uint64_t client_id, std::span<const std::uint8_t> address) {
    std::error_code ec;
    add_peer(client_id, address, ec);
    if (ec) throw std::system_error(ec);
  }
  /// As add_peer() above; sets ec instead of throwing.
  void add_peer(std::uint64_t client_id, std::span<const std::uint8_t> address, std::error_code& ec) {
    ec = wait_for<std::error_code>([&](auto done) {
      inner_.add_peer(client_id, std::vector<std::uint8_t>(address.begin(), address.end()), std::move(done));
    });
  }
  /// Inserts the advertised peer's address and brings its connection up (a 0-byte write to the
  /// advertised region, as asynchronous::FabricService::add_peer(client_id, peer, token) says),
  /// blocking until it has. Throws std::system_error with the warm-up's error.
  void add_peer(std::uint64_t client_id, const Advertisement& peer) {
    std::error_code ec;
    add_peer(client_id, peer, ec);
    if (ec) throw std::system_error(ec);
  }
  /// As add_peer(client_id, peer) above; sets ec instead of throwing.
  void add_peer(std::uint64_t client_id, const Advertisement& peer, std::error_code& ec) {
    ec = wait_for<std::error_code>([&](auto done) { inner_.add_peer(client_id, peer, std::move(done)); });
  }
  /// Releases client_id's peer once every transfer it submitted before this call has finished.
  void remove_peer(std::uint64_t client_id) { inner_.remove_peer(client_id); }

  /// Takes ownership of storage and registers it (blocking for the round trip to the fabric
  /// thread); operands inside the returned region skip per-transfer registration. Throws
  /// std::system_error: errc::zero_length_region, errc::region_range_overflows, fi_mr_reg's errors.
  template <typename S>
  MemoryRegion<S> register_region(S storage) {
    std::error_code ec;
    MemoryRegion<S> region = register_region(std::move(storage), ec);
    if (ec) throw std::system_error(ec);
    return region;
  }
  /// As register_region() above; sets ec and returns an empty region instead of throwing.
  template <typename S>
  MemoryRegion<S> register_region(S storage, std::error_code& ec) {
    auto [error, region] = wait_for<std::pair<std::error_code, MemoryRegion<S>>>([&](auto done) {
      inner_.register_region(std::move(storage),
                             [done = std::move(done)](std::error_code e, MemoryRegion<S> r) mutable {
                               done(std::pair<std::error_code, MemoryRegion<S>>(e, std::move(r)));
                             });
    });
    ec = error;
    return error ? MemoryRegion<S>() : std::move(region);
  }

  /// Transfers submitted and not yet handed to the completer.
  std::size_t outstanding() const noexcept {
    return accepted_.load(std::memory_order_relaxed) - delivery_->delivered.load(std::memory_order_relaxed);
  }
  /// The (first) endpoint's fabric address, to send to peers (efa-direct peers must insert it
  /// first).
  std::span<const std::uint8_t> local_address() const noexcept { return inner_.local_address(); }
  /// Every endpoint's fabric address, in order (one per Configuration::endpoints).
  std::vector<std::vector<std::uint8_t>> endpoint_addresses() const { return inner_.endpoint_addresses(); }
  /// How many endpoints the service opened (Configuration::endpoints); 0 before start().
  std::size_t endpoints() const noexcept { return inner_.endpoints(); }
  /// The (first) endpoint's provider, attributes and limits.
  EndpointInfo describe() const { return inner_.describe(); }
  /// The service's counters and latency histogram since it started (see dma::Metrics). Any
  /// thread, without blocking.
  Metrics metrics() const noexcept { return inner_.metrics(); }
  /// Batches whose completer threw (the exception is swallowed: it must not throw).
  std::uint64_t completer_failures() const noexcept {
    return delivery_->completer_failures.load(std::memory_order_relaxed);
  }

 private:
  // Starts an operation of the inner service with a completion handler taking one T and blocks
  // until it has run. The result crosses threads as a value; errors are thrown on this thread, so
  // no exception object is shared with the fabric thread.
  template <typename T, typename Start>
  static T wait_for(Start&& start) {
    auto promise = std::make_shared<std::promise<T>>();
    std::future<T> result = promise->get_future();
    std::forward<Start>(start)([promise](T value) mutable { promise->set_value(std::move(value)); });
    return result.get();
  }

  struct Pending {
    Completion<Context> completion;
    std::span<const std::byte> operand;
  };

  struct Handler {
    FabricService* self;
    bool want_checksum;
    void operator()(std::error_code, Completion<detail::Tracked<Context>> completion) const {
      self->collect(std::move(completion), want_checksum);
    }
  };

  FabricService(BatchCompleter<Context> completer, std::shared_ptr<Pool> pool)
      : delivery_(std::make_shared<Delivery>(std::move(completer))),
        pool_(std::move(pool)),
        work_(asio::make_work_guard(io_)),
        inner_(io_.get_executor()) {}

  void run() {
    const unsigned number = detail::fabric_thread_counter.fetch_add(1);
    thread_ = std::thread([this, number] {
      char name[16];
      std::snprintf(name, sizeof name, "fabric-%02u", number % 100);
      pthread_setname_np(pthread_self(), name);
      io_.run();
    });
  }

  // On the fabric thread, once per completion. One drain becomes one batch, delivered at the
  // drain's last completion, inside the drain: what the completer resubmits joins that pass (no
  // intake lock, no extra strand post) and is posted with the rest of the burst
  // (asynchronous::drain_position()). A completion from anywhere else (a cancellation, a refused
  // post, shutdown) gets a flush posted behind it.
  void collect(Completion<detail::Tracked<Context>>&& done, bool want_checksum) {
    Pending pending{{std::move(done.caller_context.context), std::move(done.outcome)}, done.caller_context.operand};
    if (want_checksum && pending.completion.outcome.ok() && !pending.completion.outcome->checksum) {
      checksummed_.push_back(std::move(pending));
    } else {
      batch_.push_back(std::move(pending.completion));
    }
    switch (asynchronous::drain_position()) {
      case DrainPosition::more:
        return;
      case DrainPosition::last:
        return flush();
      case DrainPosition::none:
        break;
    }
    if (flush_scheduled_) return;
    flush_scheduled_ = true;
    asio::post(io_, [this] { flush(); });
  }

  void flush() {
    flush_scheduled_ = false;
    if (!batch_.empty()) {
      delivery_->deliver(std::span(batch_), false);
      batch_.clear();
    }
    if (!checksummed_.empty()) hash_on_pool(std::exchange(checksummed_, {}));
  }

  // The job owns the delivery state, not the service: a job that runs late (a stalled pool, after
  // the destructor gave up waiting) never touches the destroyed service; it still calls the
  // completer. A pool that refuses the job (closed, or none) has it run here, on the fabric thread.
  void hash_on_pool(std::vector<Pending> jobs) {
    {
      std::lock_guard lock(delivery_->mutex);
      ++delivery_->pool_jobs;
    }
    auto finish = [delivery = delivery_](std::vector<Pending>& items) {
      std::vector<Completion<Context>> batch;
      batch.reserve(items.size());
      for (auto& item : items) {
        const auto bytes = item.completion.outcome->bytes;
        item.completion.outcome = Outcome(TransferDone{bytes, checksum(item.operand)});
        batch.push_back(std::move(item.completion));
      }
      delivery->deliver(std::span(batch), true);
    };
    auto shared_jobs = std::make_shared<std::vector<Pending>>(std::move(jobs));
    if (!pool_ || !pool_->submit([finish, shared_jobs] { finish(*shared_jobs); })) finish(*shared_jobs);
  }

  // What completions are handed to, and the count the destructor waits on.
  struct Delivery {
    explicit Delivery(BatchCompleter<Context> c) : completer(std::move(c)) {}
    void deliver(std::span<Completion<Context>> batch, bool pool_job) {
      try {
        completer(batch);
      } catch (...) {
        completer_failures.fetch_add(1, std::memory_order_relaxed);  // must not throw; never fatal
      }
      std::lock_guard lock(mutex);
      delivered += batch.size();
      if (pool_job) --pool_jobs;
      cv.notify_all();
    }
    BatchCompleter<Context> completer;
    std::mutex mutex;
    std::condition_variable cv;
    std::atomic<std::size_t> delivered{0};
    std::size_t pool_jobs = 0;
    std::atomic<std::uint64_t> completer_failures{0};
  };

  std::shared_ptr<Delivery> delivery_;
  std::shared_ptr<Pool> pool_;
  asio::io_context io_{1};
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  Inner inner_;
  std::thread thread_;
  std::chrono::nanoseconds deadline_{std::chrono::seconds(1)};

  std::mutex submit_mutex_;
  bool running_ = true;
  std::atomic<std::size_t> accepted_{0};

  bool flush_scheduled_ = false;
  std::vector<Completion<Context>> batch_;
  std::vector<Pending> checksummed_;
};

}  // namespace dma
