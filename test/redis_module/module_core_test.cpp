// The module's parts that need no server (examples/redis_module/: its arguments, its held values,
// its value workers and its copy buffers), built in every build, sanitizer builds included.
#include "copy_buffers.hpp"
#include "held_values.hpp"
#include "options.hpp"
#include "value_workers.hpp"

#include "../catch.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

std::string parse(std::initializer_list<std::string_view> arguments, dma_module::Options& options) {
  const std::vector<std::string_view> list(arguments);
  return dma_module::parse_options(list, options);
}

// Waits up to 10 s for `done`; whether it came.
template <typename Done>
bool eventually(Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// A stand-in for the server's strings: the test counts the references the module lets go.
rm::String* fake(std::uintptr_t n) { return reinterpret_cast<rm::String*>(n); }

}  // namespace

TEST_CASE("the module's arguments", "[module-core]") {
  dma_module::Options options;
  REQUIRE(parse({"max-value",
                 "4096",
                 "efa",
                 "no",
                 "hold-values",
                 "no",
                 "pool-threads",
                 "0",
                 "confirm-gets",
                 "notification",
                 "get-copy-limit",
                 "100",
                 "max-hello-bindings",
                 "8",
                 "hello-idle-seconds",
                 "5",
                 "bind",
                 "127.0.0.2",
                 "get-copy-cache",
                 "0"},
                options)
              .empty());
  CHECK(options.max_value == 4096);
  CHECK_FALSE(options.hold_values);
  CHECK(options.pool_threads == 0);
  CHECK(options.confirm_gets == dma::kv::Confirmation::notification);
  CHECK(options.get_copy_limit == 100u);
  CHECK(options.get_copy_cache == 0u);
  CHECK(dma_module::Options{}.get_copy_cache == dma_module::default_get_copy_cache);
  CHECK(options.max_hello_bindings == 8);
  CHECK(options.hello_idle_seconds == 5);
  CHECK(options.configuration().bind == "127.0.0.2");

  dma_module::Options other;
  CHECK(parse({"max-value"}, other) == "arguments come in pairs (key value); 'max-value' has no value");
  CHECK(parse({"max-value", "0"}, other) == "max-value takes a whole number of at least 1, not '0'");
  CHECK(parse({"max-value", "+5"}, other) == "max-value takes a whole number of at least 1, not '+5'");
  CHECK(parse({"max-value", "18446744073709551616"}, other).find("not '18446744073709551616'") != std::string::npos);
  CHECK(parse({"efa", "1"}, other) == "efa takes yes or no, not '1'");
  CHECK(parse({"confirm-gets", "always"}, other) == "confirm-gets takes auto, reply or notification, not 'always'");
  CHECK(parse({"colour", "blue"}, other).rfind("unknown argument 'colour'", 0) == 0);
  CHECK(other.max_value == dma_module::Options{}.max_value);  // a refusal changes nothing it did not parse
}

TEST_CASE("a bad config file is refused with its name", "[module-core]") {
  dma_module::Options options;
  REQUIRE(parse({"config", "/nonexistent/dma.toml"}, options).empty());
  CHECK_THROWS_AS(options.configuration(), dma::ConfigurationError);
}

TEST_CASE("held values: one reference each, let go exactly once", "[module-core]") {
  std::vector<rm::String*> released;
  {
    dma_module::HeldValues held([&](rm::String* s) { released.push_back(s); });
    held.hold(0, "a", {fake(1), 100, 7});
    held.hold(0, "b", {fake(2), 50, 8});
    held.hold(1, "a", {fake(3), 10, 9});
    CHECK(held.count() == 3);
    CHECK(held.bytes() == 160);
    REQUIRE(held.find(0, "a") != nullptr);
    CHECK(held.find(0, "a")->crc == 7);
    CHECK(held.find(2, "a") == nullptr);

    held.hold(0, "a", {fake(4), 30, 1});  // overwrite: the old reference goes
    CHECK(released == std::vector<rm::String*>{fake(1)});
    CHECK(held.bytes() == 90);

    held.swap_dbs(0, 1);
    CHECK(held.find(0, "a")->string == fake(3));
    CHECK(held.find(1, "b")->string == fake(2));

    held.release(1, "b");
    CHECK(released.back() == fake(2));
    held.release(1, "b");  // nothing held: nothing happens
    CHECK(released.size() == 2);

    held.release_db(1);
    CHECK(released.back() == fake(4));
    CHECK(held.count() == 1);
  }
  // The destructor lets go of the rest.
  CHECK(released == std::vector<rm::String*>{fake(1), fake(2), fake(4), fake(3)});
}

TEST_CASE("value workers: jobs run once each, after the iteration's wake", "[module-core]") {
  std::atomic<int> started{0};
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  dma_module::ValueWorkers workers(2, "test-value", [&] { ++started; });  // joined before those go
  REQUIRE(eventually([&] { return started == 2; }));
  CHECK(workers.size() == 2);
  auto job = [&](int n) {
    return [&, n] {
      const std::lock_guard lock(mutex);
      order.push_back(n);
      threads.push_back(std::this_thread::get_id());
    };
  };
  // One iteration's jobs go to one worker, in the order posted.
  for (int n = 0; n < 100; ++n)
    REQUIRE(workers.post(job(n)));
  workers.wake();
  REQUIRE(eventually([&] { return workers.ran() == 100; }));
  {
    const std::lock_guard lock(mutex);
    for (int n = 0; n < 100; ++n)
      CHECK(order[static_cast<std::size_t>(n)] == n);
    CHECK(std::count(threads.begin(), threads.end(), threads.front()) == 100);
  }
  // The next iteration's go to the other worker.
  REQUIRE(workers.post(job(100)));
  workers.wake();
  REQUIRE(eventually([&] { return workers.ran() == 101; }));
  {
    const std::lock_guard lock(mutex);
    CHECK(threads.back() != threads.front());
  }
  // A job that throws is counted, and the worker goes on.
  REQUIRE(workers.post([] { throw std::runtime_error("job"); }));
  REQUIRE(workers.post(job(101)));
  workers.wake();
  REQUIRE(eventually([&] { return workers.ran() == 103; }));
  CHECK(workers.failed() == 1);
  CHECK(workers.post({}) == false);  // an empty job is refused
}

TEST_CASE("value workers: join runs what was posted, even unwoken, and refuses what follows", "[module-core]") {
  std::atomic<int> ran{0};
  {
    dma_module::ValueWorkers workers(1, "test-value");
    for (int n = 0; n < 10; ++n)
      REQUIRE(workers.post([&] { ++ran; }));
    workers.join();  // no wake(): the jobs still run, before join returns
    CHECK(ran == 10);
    CHECK(workers.post([&] { ++ran; }) == false);
    workers.join();  // idempotent
  }
  CHECK(ran == 10);
  // The destructor joins too.
  {
    dma_module::ValueWorkers workers(3, "test-value");
    for (int n = 0; n < 30; ++n) {
      REQUIRE(workers.post([&] { ++ran; }));
      if (n % 7 == 0) workers.wake();
    }
  }
  CHECK(ran == 40);
}

TEST_CASE("copy buffers: kept up to the limit, the oldest let go first, reused for sizes within an eighth",
          "[module-core]") {
  const auto now = std::chrono::steady_clock::now();
  constexpr std::size_t mib = 1 << 20;
  auto free_all = [](const std::vector<dma_module::CopyBuffers::Buffer>& buffers) {
    for (const auto& buffer : buffers)
      std::free(buffer.data);
  };
  dma_module::CopyBuffers buffers(3 * mib);
  auto a = buffers.take(mib, now);
  REQUIRE(a.data != nullptr);
  CHECK(a.capacity == mib);
  CHECK(buffers.reused() == 0);
  CHECK(buffers.give(a).empty());  // kept
  CHECK(buffers.kept_bytes() == mib);

  auto b = buffers.take(mib - 1000, now);  // within an eighth: the kept one
  CHECK(b.data == a.data);
  CHECK(b.capacity == mib);
  CHECK(buffers.reused() == 1);
  CHECK(buffers.kept_bytes() == 0);
  CHECK(buffers.give(b).empty());

  auto small = buffers.take(mib / 2, now);  // far smaller: a new buffer, the large one stays kept
  CHECK(small.data != a.data);
  CHECK(small.capacity == mib / 2);
  auto tiny = buffers.take(4096, now);
  const auto tiny_back = buffers.give(tiny);  // under 128 KiB: never kept
  REQUIRE(tiny_back.size() == 1);
  CHECK(tiny_back[0].data == tiny.data);
  free_all(tiny_back);

  auto c = buffers.take(2 * mib, now);
  CHECK(buffers.give(c).empty());         // 3 MiB kept: at the limit
  const auto gone = buffers.give(small);  // past it: the one kept longest (a, then b) goes
  REQUIRE(gone.size() == 1);
  CHECK(gone[0].data == a.data);
  free_all(gone);
  CHECK(buffers.kept_bytes() == 2 * mib + mib / 2);
  CHECK(buffers.last_taken() == now);

  auto huge = buffers.take(4 * mib, now);  // larger than the limit: handed back
  const auto huge_back = buffers.give(huge);
  REQUIRE(huge_back.size() == 1);
  free_all(huge_back);

  const auto all = buffers.drain();
  CHECK(all.size() == 2);
  CHECK(buffers.kept_bytes() == 0);
  free_all(all);

  dma_module::CopyBuffers none(0);  // keeps nothing
  const auto returned = none.give(none.take(mib, now));
  REQUIRE(returned.size() == 1);
  free_all(returned);
}
