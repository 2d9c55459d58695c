// The CQ watcher against a fake CQ and fabric: the drain, fi_trywait, arming the fd, the backstop.
#include "cq_watcher.hpp"
#include "../catch.hpp"
#include "fake_fabric.hpp"

#include <asio/io_context.hpp>

#include <unistd.h>

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

using dma::Configuration;
using dma::WaitMode;
using dma::detail::CqEvent;
using dma::detail::CqWaited;
using dma::detail::DrainPlace;
using dma::detail::WaitPolicy;
using Watcher = dma::detail::CqWatcher<asio::io_context::executor_type>;
using namespace std::chrono_literals;

namespace {

struct Sink {
  std::vector<std::pair<void*, DrainPlace>> done;
  std::vector<int> errors;
  int firsts = 0;
  void completed(void* c, DrainPlace p) { done.emplace_back(c, p); }
  void first_done() { ++firsts; }
  int failed(fid_cq*, const fi_cq_err_entry& entry) {
    errors.push_back(entry.err);
    return 1;
  }
};

void* context(std::uintptr_t n) { return reinterpret_cast<void*>(n); }

Configuration configuration(WaitMode mode, std::size_t batch = 4) {
  Configuration c;
  c.wait_mode = mode;
  c.cq_batch = batch;
  c.backstop_interval = 1h;
  return c;
}

// Records what woke it; settles the watcher first, as a host must.
struct Host {
  explicit Host(asio::io_context& io, const Configuration& c)
      : watcher(io.get_executor(), c, WaitPolicy::WithoutFd::poll) {}
  void on_cq_event(CqEvent event) {
    watcher.accept(event);
    events.push_back(event);
  }
  Watcher watcher;
  std::vector<CqEvent> events;
};

struct Pipe {
  Pipe() { REQUIRE(::pipe(fds) == 0); }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  void signal() { REQUIRE(::write(fds[1], "x", 1) == 1); }
  int fds[2];
};

}  // namespace

TEST_CASE("a drain delivers every entry in order and marks the drain's last", "[unit][cq]") {
  asio::io_context io;
  test::FakeCq cq;
  Watcher watcher(io.get_executor(), configuration(WaitMode::fd, 4), WaitPolicy::WithoutFd::poll);
  for (std::uintptr_t i = 1; i <= 9; ++i)
    cq.push(context(i));
  Sink sink;
  CHECK(watcher.drain(&cq.cq, sink) == 9);
  REQUIRE(sink.done.size() == 9);
  for (std::size_t i = 0; i < 9; ++i) {
    CHECK(sink.done[i].first == context(i + 1));
    CHECK(sink.done[i].second == (i == 8 ? DrainPlace::last : DrainPlace::more));
  }
  CHECK(sink.firsts == 3);  // one per read that returned entries
  CHECK(watcher.counters().cq_reads.get() == 3);
}

TEST_CASE("a full last read's final entry waits for the next read to learn it is the last", "[unit][cq]") {
  asio::io_context io;
  test::FakeCq cq;
  Watcher watcher(io.get_executor(), configuration(WaitMode::fd, 4), WaitPolicy::WithoutFd::poll);
  for (std::uintptr_t i = 1; i <= 8; ++i)
    cq.push(context(i));
  Sink sink;
  CHECK(watcher.drain(&cq.cq, sink) == 8);
  REQUIRE(sink.done.size() == 8);
  CHECK(sink.done.back() == std::pair{context(8), DrainPlace::last});
  CHECK(sink.done[6].second == DrainPlace::more);
  CHECK(cq.reads == 3);  // the third read found the queue empty
}

TEST_CASE("error entries go to the sink and end a batch; a failing readerr ends the drain", "[unit][cq]") {
  asio::io_context io;
  test::FakeCq cq;
  Watcher watcher(io.get_executor(), configuration(WaitMode::fd, 4), WaitPolicy::WithoutFd::poll);
  cq.push(context(1));
  cq.push(context(2), FI_ECANCELED);
  cq.push(context(3));
  Sink sink;
  CHECK(watcher.drain(&cq.cq, sink) == 1);  // a short read ends a drain
  CHECK(watcher.drain(&cq.cq, sink) == 2);
  CHECK(sink.errors == std::vector<int>{FI_ECANCELED});
  REQUIRE(sink.done.size() == 2);
  CHECK(sink.done[0] == std::pair{context(1), DrainPlace::last});
  CHECK(sink.done[1] == std::pair{context(3), DrainPlace::last});

  cq.push(context(4), FI_EIO);
  cq.fail_readerr = true;
  CHECK(watcher.drain(&cq.cq, sink) == 0);  // never spins on -FI_EAVAIL
  CHECK(watcher.counters().queue_errors.get() == 1);

  cq.fail_readerr = false;
  cq.entries.clear();
  cq.fail_reads = true;
  CHECK(watcher.drain(&cq.cq, sink) == 0);
  CHECK(watcher.counters().queue_errors.get() == 2);
}

TEST_CASE("read_some takes no more than its limit and leaves the rest in the CQ", "[unit][cq]") {
  asio::io_context io;
  test::FakeCq cq;
  Watcher watcher(io.get_executor(), configuration(WaitMode::fd, 4), WaitPolicy::WithoutFd::poll);
  for (std::uintptr_t i = 1; i <= 6; ++i)
    cq.push(context(i));
  Sink sink;
  auto read = watcher.read_some(&cq.cq, sink, 3);
  CHECK(read.taken == 3);
  CHECK_FALSE(read.drained);
  read = watcher.read_some(&cq.cq, sink, 0);  // progress only: entries wait, none taken
  CHECK(read.taken == 0);
  CHECK_FALSE(read.drained);
  CHECK(cq.entries.size() == 3);
  read = watcher.read_some(&cq.cq, sink, 100);  // at most cq_batch (4): a short read drains
  CHECK(read.taken == 3);
  CHECK(read.drained);
  REQUIRE(sink.done.size() == 6);
  for (std::size_t i = 0; i < 6; ++i)
    CHECK(sink.done[i].first == context(i + 1));
  CHECK(watcher.read_some(&cq.cq, sink, 0).drained);

  cq.push(context(7), FI_ECANCELED);
  read = watcher.read_some(&cq.cq, sink, 4);
  CHECK(read.taken == 0);
  CHECK_FALSE(read.drained);  // an error entry was handled; more may follow
  CHECK(sink.errors == std::vector<int>{FI_ECANCELED});
  cq.fail_reads = true;
  CHECK(watcher.read_some(&cq.cq, sink, 4).drained);
  CHECK(watcher.counters().queue_errors.get() == 1);
}

TEST_CASE("fd mode arms the fd after fi_trywait and wakes when it turns readable", "[unit][cq]") {
  asio::io_context io;
  test::FakeCq cq;
  test::FakeFabric fabric;
  Pipe pipe;
  auto host = std::make_shared<Host>(io, configuration(WaitMode::fd));
  host->watcher.attach(&fabric.fabric, &cq.cq, pipe.fds[0]);
  CHECK(host->watcher.wait(host, false) == CqWaited::armed);
  CHECK(host->watcher.wait(host, false) == CqWaited::already_armed);
  CHECK(fabric.trywaits == 1);
  io.poll();
  CHECK(host->events.empty());
  pipe.signal();
  io.run_for(1s);
  REQUIRE(host->events == std::vector<CqEvent>{CqEvent::wake});
  CHECK_FALSE(host->watcher.wait_armed());
  CHECK(host->watcher.counters().fd_wakeups.get() == 1);
  host->watcher.detach();
}

TEST_CASE("fi_trywait reporting pending work makes a polling pass instead of a wait", "[unit][cq]") {
  asio::io_context io;
  test::FakeCq cq;
  test::FakeFabric fabric;
  fabric.answer = -FI_EAGAIN;
  Pipe pipe;
  auto host = std::make_shared<Host>(io, configuration(WaitMode::fd));
  host->watcher.attach(&fabric.fabric, &cq.cq, pipe.fds[0]);
  CHECK(host->watcher.wait(host, false) == CqWaited::polling);
  CHECK(host->watcher.wait(host, true) == CqWaited::polling);  // one polling pass at a time
  io.run_for(1s);
  CHECK(host->events == std::vector<CqEvent>{CqEvent::poll});
  host->watcher.detach();
}

TEST_CASE("release() cancels the fd wait and the backstop so run() returns", "[unit][cq]") {
  asio::io_context io;
  test::FakeCq cq;
  test::FakeFabric fabric;
  Pipe pipe;
  auto host = std::make_shared<Host>(io, configuration(WaitMode::fd));
  host->watcher.attach(&fabric.fabric, &cq.cq, pipe.fds[0]);
  host->watcher.arm_backstop(host);
  REQUIRE(host->watcher.wait(host, false) == CqWaited::armed);
  host->watcher.release();
  io.run_for(5s);  // returns at once: nothing left pending
  CHECK(io.stopped());
  CHECK(host->events.empty());  // cancelled waits call nothing
  host->watcher.detach();
}

TEST_CASE("the backstop fires on its interval and counts a hit only after a silent armed wait", "[unit][cq]") {
  asio::io_context io;
  test::FakeCq cq;
  test::FakeFabric fabric;
  Pipe pipe;
  Configuration c = configuration(WaitMode::fd);
  c.backstop_interval = 1ms;
  auto host = std::make_shared<Host>(io, c);
  host->watcher.attach(&fabric.fabric, &cq.cq, pipe.fds[0]);
  REQUIRE(host->watcher.wait(host, false) == CqWaited::armed);
  host->watcher.arm_backstop(host);
  for (int i = 0; i < 1000 && host->events.empty(); ++i)
    io.run_one_for(10ms);
  REQUIRE(host->events == std::vector<CqEvent>{CqEvent::backstop});
  host->watcher.backstop_found();  // the fd stayed silent for the whole interval
  CHECK(host->watcher.counters().backstop_hits.get() == 1);
  host->watcher.detach();
}
