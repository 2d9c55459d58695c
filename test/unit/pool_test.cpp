// dma::Pool: worker names, draining on join and destruction, failing and late jobs.
#include <dma/pool.hpp>
#include "../catch.hpp"

#include <asio/post.hpp>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;

namespace {

// Generous: the CI machine may be busy with other builds.
constexpr auto limit = 10s;

std::string thread_name() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

std::string worker_name(std::size_t index) {
  char name[16];
  std::snprintf(name, sizeof name, "f-pool-%02zu", index);
  return name;
}

// Strings that jobs report from the workers; the test thread waits for them and then asserts, since
// Catch2 assertions are not thread-safe.
class Reports {
 public:
  void add(std::string report) {
    // Notified under the lock: the waiter may destroy this object as soon as it sees the report.
    const std::lock_guard lock(mutex_);
    reports_.push_back(std::move(report));
    changed_.notify_all();
  }

  // True once `count` reports have arrived, false if `limit` passes first.
  bool wait_for(std::size_t count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return reports_.size() >= count; });
  }

  std::vector<std::string> all() {
    const std::lock_guard lock(mutex_);
    return reports_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> reports_;
};

// A latch whose wait gives up after `limit`, so a pool that does not run jobs side by side fails
// the test instead of hanging it.
class Rendezvous {
 public:
  explicit Rendezvous(std::size_t parties) : waiting_for_(parties) {}

  // True if every party arrived within `limit`.
  bool arrive_and_wait() {
    std::unique_lock lock(mutex_);
    if (--waiting_for_ == 0) all_here_.notify_all();
    return all_here_.wait_for(lock, limit, [&] { return waiting_for_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_here_;
  std::size_t waiting_for_;
};

// Runs `fn` on a thread of its own and waits at most `limit` for it. A hung `fn` is abandoned so
// that the test fails rather than the suite hanging; `fn` must therefore own what it touches.
bool finishes_in_time(std::function<void()> fn) {
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  std::thread([fn = std::move(fn), done] {
    fn();
    done->set_value();
  }).detach();
  return finished.wait_for(limit) == std::future_status::ready;
}

// Every worker of `pool` reports its name while all of them are held busy at once, so each name is
// seen exactly once.
std::vector<std::string> names_of_workers(dma::Pool& pool) {
  Reports reports;
  Rendezvous all_busy(pool.size());
  for (std::size_t job = 0; job < pool.size(); ++job) {
    pool.submit([&] { reports.add(all_busy.arrive_and_wait() ? thread_name() : "timed out"); });
  }
  // Without every report the jobs still hold references to the locals: wait them out in join().
  if (!reports.wait_for(pool.size())) pool.join();
  auto names = reports.all();
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("pool workers are named f-pool-00, f-pool-01, ... with two zero-padded digits", "[pool]") {
  dma::Pool pool(12);
  REQUIRE(pool.size() == 12);

  std::vector<std::string> expected;
  for (std::size_t index = 0; index < 12; ++index)
    expected.push_back(worker_name(index));
  CHECK(names_of_workers(pool) == expected);
}

TEST_CASE("worker numbering starts at f-pool-00 in every pool", "[pool]") {
  dma::Pool first(2);
  dma::Pool second(2);
  CHECK(names_of_workers(first) == std::vector<std::string>{"f-pool-00", "f-pool-01"});
  CHECK(names_of_workers(second) == std::vector<std::string>{"f-pool-00", "f-pool-01"});
}

TEST_CASE("a pool asked for zero threads has one worker", "[pool]") {
  dma::Pool pool(0);
  CHECK(pool.size() == 1);
  CHECK(names_of_workers(pool) == std::vector<std::string>{"f-pool-00"});
}

TEST_CASE("a job that throws is counted and its worker goes on running later jobs", "[pool]") {
  Reports reports;  // outlives the pool, whose destructor may still run the jobs that use it
  dma::Pool pool(1);
  pool.submit([] { throw std::runtime_error("job failed"); });
  pool.submit([&] { reports.add(thread_name()); });

  REQUIRE(reports.wait_for(1));
  CHECK(reports.all() == std::vector<std::string>{"f-pool-00"});
  CHECK(pool.failed_jobs() == 1);
  CHECK(pool.dropped_jobs() == 0);
}

TEST_CASE("a job that throws something other than an exception is counted too", "[pool]") {
  Reports reports;  // outlives the pool, whose destructor may still run the jobs that use it
  dma::Pool pool(1);
  pool.submit([] { throw 42; });
  pool.submit([&] { reports.add("ran"); });

  REQUIRE(reports.wait_for(1));
  CHECK(pool.failed_jobs() == 1);
}

TEST_CASE("the destructor runs every submitted job before returning", "[pool]") {
  auto ran = std::make_shared<std::atomic<int>>(0);
  auto pool = std::make_shared<dma::Pool>(2);
  // Slow enough that most jobs are still queued when the pool goes.
  for (int job = 0; job < 1000; ++job) {
    pool->submit([ran] {
      std::this_thread::sleep_for(50us);
      ran->fetch_add(1);
    });
  }

  REQUIRE(finishes_in_time([pool = std::move(pool)]() mutable { pool.reset(); }));
  CHECK(ran->load() == 1000);
}

TEST_CASE("join waits for every submitted job and may be called again", "[pool]") {
  auto ran = std::make_shared<std::atomic<int>>(0);
  auto pool = std::make_shared<dma::Pool>(3);
  for (int job = 0; job < 100; ++job)
    pool->submit([ran] { ran->fetch_add(1); });

  REQUIRE(finishes_in_time([pool] {
    pool->join();
    pool->join();
  }));
  CHECK(ran->load() == 100);
  CHECK(pool->size() == 3);
}

TEST_CASE("jobs run side by side on a four-thread pool", "[pool]") {
  Reports reports;
  Rendezvous all_running(4);
  dma::Pool pool(4);
  for (int job = 0; job < 4; ++job) {
    pool.submit([&] { reports.add(all_running.arrive_and_wait() ? "met" : "timed out"); });
  }

  REQUIRE(reports.wait_for(4));
  CHECK(reports.all() == std::vector<std::string>(4, "met"));
}

TEST_CASE("a job submitted after join is dropped, counted and destroyed", "[pool]") {
  dma::Pool pool(2);
  pool.join();
  auto token = std::make_shared<int>(0);
  std::atomic<bool> ran{false};

  pool.submit([token, &ran] { ran = true; });

  CHECK(pool.dropped_jobs() == 1);
  CHECK(pool.failed_jobs() == 0);
  CHECK(token.use_count() == 1);
  CHECK_FALSE(ran.load());
}

TEST_CASE("work posted through the executor runs on a pool worker", "[pool]") {
  Reports reports;  // outlives the pool, whose destructor may still run the jobs that use it
  dma::Pool pool(1);
  asio::post(pool.get_executor(), [&] { reports.add(thread_name()); });

  REQUIRE(reports.wait_for(1));
  CHECK(reports.all() == std::vector<std::string>{"f-pool-00"});
}
