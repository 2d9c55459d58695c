// A passive peer with one buffer (a dma::TargetThread) and helpers to drive a service's io_context with a time bound.
#pragma once

#include "../catch.hpp"

#include <dma/dma.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <set>
#include <thread>
#include <vector>

namespace test {

inline constexpr std::size_t mib = std::size_t{1} << 20;

inline dma::Configuration loopback_configuration() {
  dma::Configuration configuration;
  configuration.bind = "127.0.0.1";
  return configuration;
}

/// A byte-vector context that also counts how often it was handed back.
struct Payload {
  std::vector<std::byte> bytes;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t n) {
    bytes.resize(n);
    return bytes;
  }
};

/// A passive peer with one exposed buffer, progressed on its own thread.
class RemoteBuffer {
 public:
  explicit RemoteBuffer(std::size_t size, std::byte fill = std::byte{0})
      : RemoteBuffer(size, fill, loopback_configuration()) {}
  /// A target that waits for its own completions in `target_wait` mode.
  RemoteBuffer(std::size_t size, dma::WaitMode target_wait)
      : RemoteBuffer(size, std::byte{0}, with_wait(target_wait)) {}
  RemoteBuffer(std::size_t size, std::byte fill, const dma::Configuration& configuration)
      : thread_(dma::TargetThread::start(configuration)), memory_(size, fill) {
    region_ = thread_->expose(memory_);
  }
  /// Stops driving the target's progress: transfers to it stay in flight until resume().
  void pause() { thread_->pause(); }
  void resume() { thread_->resume(); }
  const dma::Advertisement& advertisement() const { return region_.advertisement(); }
  std::vector<std::byte>& memory() { return memory_; }
  dma::Target& target() { return thread_->target(); }

  template <typename Context>
  dma::TransferRequest<Context> request(dma::Direction direction, Context context, std::size_t length = 0,
                                        std::uint64_t offset = 0) const {
    dma::TransferRequest<Context> r;
    r.client_id = 1;
    r.set_peer(advertisement(), offset);
    r.direction = direction;
    r.length = length;
    r.caller_context = std::move(context);
    return r;
  }

 private:
  static dma::Configuration with_wait(dma::WaitMode mode) {
    auto c = loopback_configuration();
    c.wait_mode = mode;
    return c;
  }
  std::unique_ptr<dma::TargetThread> thread_;
  std::vector<std::byte> memory_;
  dma::Target::Region region_;
};

/// A use_future token whose future holds the Completion whether the transfer succeeded or not
/// (plain asio::use_future throws the error from get() and loses the context).
inline auto completion_future() {
  return asio::use_future([](std::error_code, auto completion) { return completion; });
}

/// Runs io until future is ready or the bound passes; returns whether it became ready.
template <typename T>
bool run_until(asio::io_context& io, std::future<T>& future,
               std::chrono::milliseconds bound = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    io.restart();
    io.run_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// Submits request with a plain completion handler and runs io until it completes (60 s at most);
/// counts the handler's runs in *calls and stores the posts in flight it saw in *in_flight.
template <typename Context>
dma::Completion<Context> await_one(asio::io_context& io, dma::asynchronous::FabricService<Context>& service,
                                   dma::TransferRequest<Context> request, int* calls = nullptr,
                                   std::size_t* in_flight = nullptr) {
  std::promise<dma::Completion<Context>> promise;
  auto future = promise.get_future();
  service.submit(std::move(request), [&, calls, in_flight](std::error_code, dma::Completion<Context> c) {
    if (calls != nullptr) ++*calls;
    if (in_flight != nullptr) *in_flight = service.metrics().posts_in_flight;
    promise.set_value(std::move(c));
  });
  REQUIRE(run_until(io, future, std::chrono::seconds(60)));
  return future.get();
}

/// The same through `co_await service.submit(request)` in a coroutine on io.
template <typename Context>
dma::Completion<Context> co_await_one(asio::io_context& io, dma::asynchronous::FabricService<Context>& service,
                                      dma::TransferRequest<Context> request) {
  auto future = asio::co_spawn(
      io,
      [&]() -> asio::awaitable<dma::Completion<Context>> {
        auto [ec, completion] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));
        CHECK(ec == completion.outcome.error());
        co_return std::move(completion);
      },
      asio::use_future);
  REQUIRE(run_until(io, future, std::chrono::seconds(60)));
  return future.get();
}

/// Runs io for `period`, in short slices: time for anything that must not come to arrive.
inline void run_for(asio::io_context& io, std::chrono::milliseconds period) {
  const auto until = std::chrono::steady_clock::now() + period;
  while (std::chrono::steady_clock::now() < until) {
    io.restart();
    io.run_for(std::chrono::milliseconds(10));
  }
}

/// Freezes remote, submits request, gives it 50 ms to be posted, cancels it through its handler's
/// slot, then resumes remote and waits 200 ms more: the completion, and how often its handler ran.
template <typename Service, typename Context>
std::pair<dma::Completion<Context>, int> cancel_while_frozen(asio::io_context& io, Service& service,
                                                             RemoteBuffer& remote,
                                                             dma::TransferRequest<Context> request) {
  remote.pause();
  asio::cancellation_signal signal;
  std::promise<dma::Completion<Context>> promise;
  auto future = promise.get_future();
  int calls = 0;
  service.submit(std::move(request),
                 asio::bind_cancellation_slot(signal.slot(), [&](std::error_code, dma::Completion<Context> c) {
                   if (++calls == 1) promise.set_value(std::move(c));
                 }));
  run_for(io, std::chrono::milliseconds(50));
  signal.emit(asio::cancellation_type::terminal);
  REQUIRE(run_until(io, future));
  auto completion = future.get();
  remote.resume();
  run_for(io, std::chrono::milliseconds(200));
  return {std::move(completion), calls};
}

inline std::vector<std::byte> pattern(std::size_t size, unsigned seed) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return bytes;
}

/// Byte-for-byte equality that reports only the first difference (Catch would print every byte).
inline bool same(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  if (a.size() != b.size()) {
    UNSCOPED_INFO("sizes differ: " << a.size() << " vs " << b.size());
    return false;
  }
  const auto [x, y] = std::mismatch(a.begin(), a.end(), b.begin());
  if (x == a.end()) return true;
  UNSCOPED_INFO("first difference at byte " << (x - a.begin()) << ": " << int(*x) << " vs " << int(*y));
  return false;
}

}  // namespace test
