// Steady-state transfers allocate nothing: global operator new is counted around a window of
// transfers after warm-up, for use_awaitable and for the callback service.
#include <execinfo.h>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <atomic>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>

#include "../loopback/fixture.hpp"
#include "notification_queue.hpp"
#include "segment_plan.hpp"
#include "segment_tracker.hpp"

namespace {
std::atomic<std::uint64_t> allocations{0};

// While a window is open, the first few allocations keep their call stacks, so a failing check
// says where they came from (addresses; `addr2line -Cfpe` turns them into lines).
struct Origins {
  static constexpr int kept = 4;
  static constexpr int frames = 24;
  std::atomic<bool> open{false};
  std::atomic<int> taken{0};
  std::array<std::array<void*, frames>, kept> stacks{};
  std::array<int, kept> depths{};

  void start() {
    taken = 0;
    open = true;
  }
  void stop() { open = false; }
  void record() {
    if (!open.load(std::memory_order_relaxed)) return;
    const int slot = taken.fetch_add(1, std::memory_order_relaxed);
    if (slot < kept)
      depths[static_cast<std::size_t>(slot)] = backtrace(stacks[static_cast<std::size_t>(slot)].data(), frames);
  }
  std::string describe() const {
    std::ostringstream out;
    for (int i = 0; i < std::min(taken.load(), kept); ++i) {
      out << "allocation " << i + 1 << ":";
      char** names = backtrace_symbols(stacks[static_cast<std::size_t>(i)].data(), depths[static_cast<std::size_t>(i)]);
      for (int f = 0; f < depths[static_cast<std::size_t>(i)]; ++f)
        out << "\n  " << (names != nullptr ? names[f] : "?");
      std::free(names);
      out << "\n";
    }
    return out.str();
  }
} origins;

// backtrace() loads libgcc's unwinder on its first call, which allocates: done before any window.
[[maybe_unused]] const int unwinder_loaded = [] {
  void* frame[1];
  return backtrace(frame, 1);
}();
}  // namespace

// This file replaces both operator new and operator delete (over malloc/free); g++ cannot see that
// they match when it inlines a library's `delete`.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  origins.record();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

struct Slice {
  std::span<std::byte> bytes;
  std::span<const std::byte> source() const { return bytes; }
};

constexpr int depth = 16;
constexpr int warm_up = 3000;
constexpr int window = 3000;

dma::Configuration configuration(dma::WaitMode mode) {
  auto c = test::loopback_configuration();
  c.wait_mode = mode;
  return c;
}

/// `depth` coroutine lanes, each awaiting request_for(lane) again and again, until warm_up +
/// window transfers are done: the heap allocations counted over the window. `failed` counts the
/// transfers that failed.
template <typename Context, typename RequestFor>
std::uint64_t allocations_over_window(asio::io_context& io, dma::asynchronous::FabricService<Context>& service,
                                      RequestFor request_for, int& failed) {
  int done = 0;
  std::uint64_t before = 0, after = 0;
  auto lane = [&](int index) -> asio::awaitable<void> {
    auto request = request_for(index);
    while (done < warm_up + window) {
      auto [ec, completion] =
          co_await service.submit(dma::TransferRequest<Context>(request), dma::compat::as_tuple(asio::use_awaitable));
      if (ec) ++failed;
      if (++done == warm_up) {
        before = allocations.load();
        origins.start();
      }
      if (done == warm_up + window) {
        after = allocations.load();
        origins.stop();
      }
    }
  };
  for (int i = 0; i < depth; ++i)
    asio::co_spawn(io, lane(i), asio::detached);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (done < warm_up + window + depth - 1 && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(std::chrono::milliseconds(50));
  }
  REQUIRE(done >= warm_up + window);
  return after - before;
}

}  // namespace

TEST_CASE("steady-state awaitable transfers allocate nothing", "[alloc]") {
  const auto mode = GENERATE(dma::WaitMode::fd, dma::WaitMode::adaptive, dma::WaitMode::busy_poll);
  INFO("wait mode " << dma::to_string(mode));
  test::RemoteBuffer remote(64 * depth);
  asio::io_context io(1);
  dma::asynchronous::FabricService<Slice> service(io, configuration(mode));
  std::vector<std::byte> local(64 * depth, std::byte{7});
  int failed = 0;
  const std::uint64_t allocated = allocations_over_window(
      io, service,
      [&](int index) {
        auto request =
            remote.request(dma::Direction::ToPeer, Slice{std::span(local).subspan(index * 64, 64)}, 0, index * 64);
        return request;
      },
      failed);
  CHECK(failed == 0);
  INFO("allocations in " << window << " transfers: " << allocated << "\n" << origins.describe());
  CHECK(allocated == 0);
}

TEST_CASE("steady-state writes with immediate data allocate nothing, the target's notifications included", "[alloc]") {
  test::RemoteBuffer remote(64 * depth);
  std::atomic<std::uint64_t> heard{0};
  remote.target().set_notification_callback([&](std::error_code ec, dma::WriteNotification) {
    if (!ec) heard.fetch_add(1, std::memory_order_relaxed);
  });
  asio::io_context io(1);
  dma::asynchronous::FabricService<Slice> service(io, configuration(dma::WaitMode::adaptive));
  std::vector<std::byte> local(64 * depth, std::byte{5});
  int failed = 0;
  const std::uint64_t allocated = allocations_over_window(
      io, service,
      [&](int index) {
        auto request =
            remote.request(dma::Direction::ToPeer, Slice{std::span(local).subspan(index * 64, 64)}, 0, index * 64);
        request.immediate_data = static_cast<std::uint64_t>(index);
        return request;
      },
      failed);
  CHECK(failed == 0);
  CHECK(heard.load() > 0);
  INFO("allocations in " << window << " transfers: " << allocated << "\n" << origins.describe());
  CHECK(allocated == 0);
}

TEST_CASE("steady-state callback transfers allocate nothing", "[alloc]") {
  const auto mode = GENERATE(dma::WaitMode::fd, dma::WaitMode::adaptive, dma::WaitMode::busy_poll);
  INFO("wait mode " << dma::to_string(mode));
  test::RemoteBuffer remote(64 * depth);
  std::vector<std::byte> local(64 * depth, std::byte{9});
  std::atomic<int> done{0};
  std::atomic<std::uint64_t> before{0}, after{0};
  std::unique_ptr<dma::FabricService<Slice>> service;
  auto request_for = [&](int lane) {
    return remote.request(dma::Direction::ToPeer, Slice{std::span(local).subspan(lane * 64, 64)}, 0, lane * 64);
  };
  service = dma::FabricService<Slice>::start(
      configuration(mode),
      [&](std::span<dma::Completion<Slice>> batch) {
        for (auto& completion : batch) {
          const int n = ++done;
          if (n == warm_up) {
            before = allocations.load();
            origins.start();
          }
          if (n == warm_up + window) {
            after = allocations.load();
            origins.stop();
          }
          if (n <= warm_up + window) {
            const int lane = static_cast<int>((completion.caller_context.bytes.data() - local.data()) / 64);
            (void)service->submit(request_for(lane));
          }
        }
      },
      nullptr);
  for (int i = 0; i < depth; ++i)
    REQUIRE_FALSE(service->submit(request_for(i)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (done < warm_up + window && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(done >= warm_up + window);
  INFO("allocations in " << window << " transfers: " << after - before << "\n" << origins.describe());
  CHECK(after - before == 0);
  service.reset();
}

namespace {

// Up to six local buffers of one lane, written as one transfer, inside a cacheable span.
struct Parts {
  std::array<std::span<const std::byte>, 6> parts{};
  std::size_t count = 0;
  dma::CacheableSpan whole{};
  std::span<const std::span<const std::byte>> sources() const { return std::span(parts).first(count); }
  std::optional<dma::CacheableSpan> cacheable_span() const { return whole; }
};

}  // namespace

TEST_CASE("steady-state segmented and gathered transfers allocate nothing", "[alloc]") {
  const bool gather = GENERATE(false, true);
  const bool forced = GENERATE(false, true);
  INFO((gather ? "a gather of 6 buffers of 64 B (2 posts at iov_limit 4)" : "1 KiB in 256 B segments (4 posts)")
       << (forced ? ", registered locally" : ""));
  constexpr std::size_t lane_bytes = 1024;
  test::RemoteBuffer remote(lane_bytes * depth);
  asio::io_context io(1);
  auto c = configuration(dma::WaitMode::adaptive);
  c.max_segment_bytes = 256;
  c.force_local_registration = forced;
  dma::asynchronous::FabricService<Parts> service(io, c);
  std::vector<std::byte> local(lane_bytes * depth, std::byte{3});
  const auto whole = *dma::CacheableSpan::make(reinterpret_cast<std::uintptr_t>(local.data()), local.size());
  int failed = 0;
  const std::uint64_t allocated = allocations_over_window(
      io, service,
      [&](int index) {
        Parts parts;
        parts.whole = whole;
        const auto mine = std::span(local).subspan(static_cast<std::size_t>(index) * lane_bytes, lane_bytes);
        if (gather) {
          parts.count = 6;
          for (std::size_t i = 0; i < 6; ++i)
            parts.parts[i] = mine.subspan(i * 128, 64);  // apart, so each is an iov entry of its own
        } else {
          parts.count = 1;
          parts.parts[0] = mine;
        }
        auto request = remote.request(dma::Direction::ToPeer, parts, 0, static_cast<std::uint64_t>(index) * lane_bytes);
        return request;
      },
      failed);
  CHECK(failed == 0);
  const dma::Metrics m = service.metrics();
  CHECK(m.segmented >= static_cast<std::uint64_t>(warm_up + window));
  CHECK(m.posted >= 2 * m.segmented);
  INFO("allocations in " << window << " transfers: " << allocated << "\n" << origins.describe());
  CHECK(allocated == 0);
}

TEST_CASE("steady-state striped transfers allocate nothing", "[alloc]") {
  const auto direction = GENERATE(dma::Direction::ToPeer, dma::Direction::FromPeer);
  INFO((direction == dma::Direction::ToPeer ? "writes" : "reads") << " of 8 KiB striped over 2 endpoints");
  constexpr std::size_t lane_bytes = 8192;
  test::RemoteBuffer remote(lane_bytes * depth);
  asio::io_context io(1);
  auto c = configuration(dma::WaitMode::adaptive);
  c.endpoints = 2;
  c.stripe_threshold = 4096;
  struct Both {
    std::span<std::byte> bytes;
    std::span<const std::byte> source() const { return bytes; }
    std::span<std::byte> allocate(std::size_t) const { return bytes; }
  };
  dma::asynchronous::FabricService<Both> service(io, c);
  std::vector<std::byte> local(lane_bytes * depth, std::byte{4});
  int failed = 0;
  const std::uint64_t allocated = allocations_over_window(
      io, service,
      [&](int index) {
        const auto offset = static_cast<std::size_t>(index) * lane_bytes;
        auto request =
            remote.request(direction, Both{std::span(local).subspan(offset, lane_bytes)}, lane_bytes, offset);
        return request;
      },
      failed);
  CHECK(failed == 0);
  CHECK(service.metrics().completed >= 2 * static_cast<std::uint64_t>(warm_up + window));  // two parts each
  INFO("allocations in " << window << " transfers: " << allocated << "\n" << origins.describe());
  CHECK(allocated == 0);
}

// The per-transfer parts of segmented and gathered transfers and of write notifications: a
// 64 MiB write in 1 MiB posts, a gather of 9 buffers over iov_limit 4, and 10,000 notifications.
TEST_CASE("planning, tracking and queueing notifications allocate nothing", "[alloc]") {
  using namespace dma::detail;
  constexpr std::size_t mib = std::size_t{1} << 20;
  std::vector<std::byte> memory(9 * 64);
  std::vector<LocalSegment> gather;
  for (std::size_t i = 0; i < 9; ++i)
    gather.push_back({memory.data() + 64 * i, 64, nullptr});
  const LocalSegment big[] = {{reinterpret_cast<std::byte*>(std::uintptr_t{1} << 32), 64 * mib, nullptr}};
  const RemoteSegment big_remote[] = {{0, 64 * mib, 1}};
  const RemoteSegment gather_remote[] = {{0, 9 * 64, 1}};
  SegmentTracker tracker;
  NotificationQueue queue(64);
  const std::uint64_t before = allocations.load();
  std::size_t posts = 0;
  for (int round = 0; round < 100; ++round) {
    ShapeError error{};
    const SegmentPlan plans[] = {SegmentPlan::make(big, big_remote, {mib, 4, 4}, error),
                                 SegmentPlan::make(gather, gather_remote, {mib, 4, 4}, error)};
    for (const SegmentPlan& plan : plans) {
      tracker.start(nullptr, plan.total(), 8);
      SegmentPost post;
      SegmentCursor at;
      while (!tracker.finished()) {
        while (SegmentSlot* slot = plan.finished(at) ? nullptr : tracker.next_slot()) {
          at = plan.fill(at, post);
          tracker.posted(*slot, post.bytes, 0);
          ++posts;
        }
        tracker.for_each_in_flight([&](SegmentSlot& slot) { (void)tracker.returned(slot); });
      }
      REQUIRE(tracker.outcome().ok());
    }
    for (std::uint64_t i = 0; i < 100; ++i) {
      (void)queue.push({i, 0, 0});
      Notification n;
      std::uint64_t lost = 0;
      (void)queue.pop(n, lost);
    }
  }
  REQUIRE(allocations.load() - before == 0);
  REQUIRE(posts == 100 * (64 + 3));
}
