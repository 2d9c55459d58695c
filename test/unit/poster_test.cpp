// The poster against a fake host: credits, turns, FI_MORE, -FI_EAGAIN and stalls.
#include "poster.hpp"
#include "../catch.hpp"
#include "local_socket.hpp"

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using dma::detail::Operation;
using dma::detail::Peer;
using dma::detail::Poster;
using dma::detail::state;
using namespace std::chrono_literals;

namespace {

struct Posted {
  Operation* op;
  fi_addr_t peer;
  bool more;
};

// Answers posts from a script (0 when it runs out) and records everything.
struct Host {
  std::deque<ssize_t> answers;
  std::vector<Posted> posts;
  std::vector<std::pair<Operation*, std::error_code>> failures;
  int refreshes = 0;

  std::error_code prepare(Operation&) { return {}; }
  ssize_t post(Operation& op, fi_addr_t peer, bool more) {
    const ssize_t rc = answers.empty() ? 0 : answers.front();
    if (!answers.empty()) answers.pop_front();
    if (rc == 0) posts.push_back({&op, peer, more});
    return rc;
  }
  void posted(Operation&) {}
  std::error_code refresh(Peer&) {
    ++refreshes;
    return {};
  }
  void fail_queued(Operation* op, std::error_code ec, const std::string&) { failures.emplace_back(op, ec); }
  // Whole transfers only: a segmented one never reaches this host.
  void fail_prepared(Operation* op, std::error_code ec) { fail_queued(op, ec, "preparing the post"); }
  dma::detail::SegmentStep segment_step(Operation&) { return dma::detail::SegmentStep::post; }
  bool segment_continues(const Operation&) const { return false; }
  bool segment_all_posted(const Operation&) const { return true; }
  void stop_segmented(Operation*) {}
};

struct Rig {
  explicit Rig(std::size_t credits, std::size_t limit = 100, std::chrono::nanoseconds progress = 1h) {
    poster.set_limits({credits, limit, progress, 1s, 30s});
    for (std::size_t i = 0; i < peers.size(); ++i)
      peers[i].handle = 10 + i;
  }
  // An operation the engine took, for peer (its state is trivial to leave: no lease).
  Operation& take(std::size_t peer) {
    Operation& op = ops.emplace_back();
    dma::detail::begin_state(op).peer = &peers[peer];
    return op;
  }
  Operation* queue(std::size_t peer) {
    Operation& op = take(peer);
    poster.enqueue(peers[peer].flow, &op);
    return &op;
  }
  Poster poster;
  std::array<Peer, 2> peers;
  std::deque<Operation> ops;
  Host host;
};

}  // namespace

TEST_CASE("a peer posts up to its credits, with FI_MORE on all but the burst's last", "[unit][poster]") {
  Rig rig(2);
  Operation* a = rig.queue(0);
  Operation* b = rig.queue(0);
  Operation* c = rig.queue(0);
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.posts.size() == 2);
  CHECK(rig.host.posts[0].op == a);
  CHECK(rig.host.posts[0].more);
  CHECK(rig.host.posts[1].op == b);
  CHECK_FALSE(rig.host.posts[1].more);  // no credit left for the one behind it
  CHECK(rig.poster.in_flight() == 2);
  CHECK(rig.poster.queued() == 1);

  rig.poster.returned(rig.peers[0].flow);  // a credit comes back
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.posts.size() == 3);
  CHECK(rig.host.posts[2].op == c);
  CHECK(state(*c).posted);
}

TEST_CASE("ready peers take turns, one transfer each", "[unit][poster]") {
  Rig rig(4);
  rig.queue(0);
  rig.queue(0);
  rig.queue(1);
  rig.queue(1);
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.posts.size() == 4);
  CHECK(rig.host.posts[0].peer == 10);
  CHECK(rig.host.posts[1].peer == 11);
  CHECK(rig.host.posts[2].peer == 10);
  CHECK(rig.host.posts[3].peer == 11);
  CHECK(rig.host.posts[2].more);
  CHECK_FALSE(rig.host.posts[3].more);
}

TEST_CASE("the all-peers limit holds whatever each peer's credits allow", "[unit][poster]") {
  Rig rig(4, 3);
  for (int i = 0; i < 4; ++i) {
    rig.queue(0);
    rig.queue(1);
  }
  rig.poster.post_pending(rig.host);
  CHECK(rig.host.posts.size() == 3);
  CHECK_FALSE(rig.host.posts.back().more);
}

TEST_CASE("a refused post parks its peer while the others go on", "[unit][poster]") {
  Rig rig(4);
  Operation* refused = rig.queue(0);
  rig.queue(1);
  rig.host.answers = {-FI_EAGAIN};
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.posts.size() == 1);
  CHECK(rig.host.posts[0].peer == 11);
  CHECK(rig.poster.eagain() == 1);
  CHECK_FALSE(state(*refused).posted);

  rig.poster.post_pending(rig.host);  // the next pass tries the parked peer again
  REQUIRE(rig.host.posts.size() == 2);
  CHECK(rig.host.posts[1].op == refused);
  CHECK(rig.peers[0].flow.stalled_since == dma::detail::Clock::time_point{});
}

TEST_CASE("refusals for progress_deadline mark the peer unreachable and fail its queue", "[unit][poster]") {
  Rig rig(4, 100, 0ns);
  Operation* a = rig.queue(0);
  Operation* b = rig.queue(0);
  rig.host.answers = {-FI_EAGAIN};
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.failures.size() == 2);
  CHECK(rig.host.failures[0] == std::pair{a, make_error_code(dma::errc::connection_refused)});
  CHECK(rig.host.failures[1].first == b);
  CHECK(rig.poster.marked_unreachable() == 1);
  CHECK(rig.peers[0].flow.refresh);
  CHECK(rig.poster.idle());
}

TEST_CASE("a connection refused by a listening address is reported as rejected", "[unit][poster][probe]") {
  // Something accepts TCP connections at the peer's address, yet libfabric never connects: the
  // case of a peer that speaks another wire protocol. The probe starts halfway to the deadline.
  auto listener = std::make_unique<test::LocalSocket>(true);

  Rig rig(4, 100, 200ms);
  rig.peers[0].address = listener->bytes;
  Operation* op = rig.queue(0);
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < 2000 && rig.host.failures.empty(); ++pass) {  // at most 20 s
    rig.host.answers = {-FI_EAGAIN};
    rig.poster.post_pending(rig.host);
    std::this_thread::sleep_for(10ms);
  }
  listener.reset();
  REQUIRE(rig.host.failures.size() == 1);
  CHECK(rig.host.failures[0] == std::pair{op, make_error_code(dma::errc::connection_rejected)});
  CHECK(std::chrono::steady_clock::now() - start >= 200ms);
  CHECK_FALSE(rig.peers[0].probe.started());
}

TEST_CASE("a broken connection gets a fresh AV entry once its posted transfers are back", "[unit][poster]") {
  Rig rig(4);
  rig.queue(0);
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.posts.size() == 1);
  rig.peers[0].flow.refresh = true;  // its connection broke
  Operation* next = rig.queue(0);
  rig.poster.post_pending(rig.host);
  CHECK(rig.host.posts.size() == 1);  // waits: one of its transfers is still posted
  CHECK(rig.host.refreshes == 0);
  rig.poster.returned(rig.peers[0].flow);
  rig.poster.post_pending(rig.host);
  CHECK(rig.host.refreshes == 1);
  REQUIRE(rig.host.posts.size() == 2);
  CHECK(rig.host.posts[1].op == next);
  CHECK(rig.poster.reconnects() == 1);
}

TEST_CASE("any other post error fails that transfer and the rest still post", "[unit][poster]") {
  Rig rig(4);
  Operation* bad = rig.queue(0);
  rig.queue(0);
  rig.host.answers = {-FI_EINVAL};
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.failures.size() == 1);
  CHECK(rig.host.failures[0].first == bad);
  CHECK(rig.host.posts.size() == 1);
}

TEST_CASE("a write's flags follow its completion level and immediate data", "[unit][poster]") {
  using dma::detail::write_flags;
  dma::TransferFields request;
  CHECK(write_flags(request, FI_INJECT_COMPLETE) == FI_DELIVERY_COMPLETE);
  request.completion = dma::CompletionLevel::transmit;
  CHECK(write_flags(request, FI_INJECT_COMPLETE) == FI_INJECT_COMPLETE);
  CHECK(write_flags(request, FI_TRANSMIT_COMPLETE) == FI_TRANSMIT_COMPLETE);
  request.immediate_data = 0;
  CHECK(write_flags(request, FI_INJECT_COMPLETE) == (FI_INJECT_COMPLETE | FI_REMOTE_CQ_DATA));
}

TEST_CASE("immediate data is refused on a read and when wider than cq_data_size", "[unit][poster]") {
  using dma::detail::check_immediate_data;
  dma::TransferFields request;
  CHECK_FALSE(check_immediate_data(request, 0));  // no immediate data: nothing to check
  request.immediate_data = 0xffff'ffff;
  CHECK_FALSE(check_immediate_data(request, 8));
  CHECK_FALSE(check_immediate_data(request, 4));
  CHECK(check_immediate_data(request, 0) == dma::errc::immediate_data_too_wide);
  request.immediate_data = 0x1'0000'0000;
  CHECK(check_immediate_data(request, 4) == dma::errc::immediate_data_too_wide);
  CHECK(check_immediate_data(request, 4) == dma::condition::invalid_operand);
  request.direction = dma::Direction::FromPeer;
  CHECK(check_immediate_data(request, 8) == dma::errc::immediate_data_on_read);
}

TEST_CASE("a suspect goes alone: after the peer's other posts return, and nothing follows it until it returns",
          "[unit][poster]") {
  Rig rig(8);
  Operation* a = rig.queue(0);
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.posts.size() == 1);

  Operation* b = rig.queue(0);
  Operation& suspect = rig.take(0);
  state(suspect).suspect = true;
  rig.poster.requeue(rig.peers[0].flow, &suspect);  // ahead of b
  rig.poster.post_pending(rig.host);
  CHECK(rig.host.posts.size() == 1);  // a is still out: the suspect waits

  state(*a).posted = false;
  rig.poster.returned(rig.peers[0].flow);
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.posts.size() == 2);
  CHECK(rig.host.posts[1].op == &suspect);
  CHECK(rig.peers[0].flow.isolating);
  rig.poster.post_pending(rig.host);
  CHECK(rig.host.posts.size() == 2);  // b waits for the suspect

  rig.peers[0].flow.isolating = false;  // the engine clears it when the suspect comes back
  rig.poster.returned(rig.peers[0].flow);
  rig.poster.post_pending(rig.host);
  REQUIRE(rig.host.posts.size() == 3);
  CHECK(rig.host.posts[2].op == b);
}

TEST_CASE("a transfer posted again that meets a refused connection marks its peer unreachable at once",
          "[unit][poster]") {
  Rig rig(4, 100, 1h);
  test::LocalSocket closed(false);  // bound, not listening: a connection is refused
  rig.peers[0].address = closed.bytes;
  Operation& again = rig.take(0);
  state(again).reposted = true;
  rig.poster.requeue(rig.peers[0].flow, &again);
  // The probe's refusal may take a moment on a loaded machine: retry, bounded.
  for (int round = 0; round < 200 && rig.host.failures.empty(); ++round) {
    rig.host.answers.push_back(-FI_EAGAIN);
    rig.poster.post_pending(rig.host);
    if (rig.host.failures.empty()) std::this_thread::sleep_for(5ms);
  }
  REQUIRE(rig.host.failures.size() == 1);
  CHECK(rig.host.failures[0].second == dma::errc::connection_refused);
  CHECK(rig.peers[0].flow.markings == 1);
}

TEST_CASE("a transfer posted again to a peer that accepts but does not answer waits, parked, past progress_deadline",
          "[unit][poster]") {
  Rig rig(4, 100, 1ms);
  test::LocalSocket listener(true);  // the kernel accepts for it; nobody answers
  rig.peers[0].address = listener.bytes;
  Operation& again = rig.take(0);
  state(again).reposted = true;
  rig.poster.requeue(rig.peers[0].flow, &again);
  for (int round = 0; round < 20; ++round) {
    rig.host.answers.push_back(-FI_EAGAIN);
    rig.poster.post_pending(rig.host);
    std::this_thread::sleep_for(2ms);
  }
  CHECK(rig.host.failures.empty());
  CHECK(rig.poster.queued() == 1);
  CHECK(rig.peers[0].flow.markings == 0);
}
