// One logical transfer of several posts: one completion, bytes counted once, the first error kept,
// and no completion while the provider still holds a post.
#include "segment_tracker.hpp"
#include "../catch.hpp"

#include <dma/error.hpp>

#include <cstddef>
#include <deque>
#include <random>
#include <set>
#include <vector>

using dma::detail::SegmentSlot;
using dma::detail::SegmentTracker;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

// Posts as many segments of `segment` bytes as the tracker allows; returns the slots posted.
std::vector<SegmentSlot*> post_all_allowed(SegmentTracker& tracker, std::size_t segment, std::uint32_t generation = 0) {
  std::vector<SegmentSlot*> posted;
  while (SegmentSlot* slot = tracker.next_slot()) {
    const std::size_t bytes = std::min(segment, tracker.total() - tracker.bytes_posted());
    tracker.posted(*slot, bytes, generation);
    posted.push_back(slot);
  }
  return posted;
}

}  // namespace

TEST_CASE("a 64 MiB transfer in 1 MiB posts completes once, with its length counted once", "[segment_tracker]") {
  SegmentTracker tracker;
  int owner = 0;
  tracker.start(&owner, 64 * mib, 8);
  std::deque<SegmentSlot*> in_flight;
  int completions = 0;
  for (int round = 0; round < 1000 && !tracker.finished(); ++round) {
    for (SegmentSlot* slot : post_all_allowed(tracker, mib))
      in_flight.push_back(slot);
    REQUIRE(tracker.in_flight() <= 8);
    SegmentSlot* back = in_flight.front();
    in_flight.pop_front();
    REQUIRE(back->owner == &owner);
    if (tracker.returned(*back)) ++completions;
  }
  REQUIRE(completions == 1);
  REQUIRE(tracker.finished());
  REQUIRE(tracker.posts() == 64);
  REQUIRE(tracker.returns() == 64);
  REQUIRE(tracker.bytes_done() == 64 * mib);
  const dma::Outcome outcome = tracker.outcome(0x1234u);
  REQUIRE(outcome.ok());
  REQUIRE(outcome->bytes == 64 * mib);
  REQUIRE(outcome->checksum == 0x1234u);
}

TEST_CASE("a middle segment's error fails the transfer once, after every posted segment came back",
          "[segment_tracker]") {
  SegmentTracker tracker;
  tracker.start(nullptr, 8 * mib, 4);
  std::vector<SegmentSlot*> first = post_all_allowed(tracker, mib);
  REQUIRE(first.size() == 4);
  // The second post fails; the others of the window are still with the provider.
  REQUIRE_FALSE(tracker.returned(*first[1], dma::fabric_error(FI_ECANCELED), 2, "connection reset"));
  REQUIRE(tracker.failed());
  REQUIRE(tracker.next_slot() == nullptr);  // nothing more is posted
  REQUIRE_FALSE(tracker.returned(*first[0]));
  REQUIRE_FALSE(tracker.returned(*first[3], dma::fabric_error(FI_ECANCELED), 107, "later error"));
  REQUIRE(tracker.returned(*first[2]));  // the last one the provider held
  REQUIRE(tracker.finished());
  REQUIRE(tracker.posts() == 4);
  const dma::Outcome outcome = tracker.outcome();
  REQUIRE_FALSE(outcome.ok());
  REQUIRE(outcome.error() == dma::fabric_error(FI_ECANCELED));
  REQUIRE(outcome.provider_errno() == 2);
  REQUIRE(outcome.message().find("connection reset") != std::string::npos);
}

TEST_CASE("a refused post fails a transfer with nothing in flight at once", "[segment_tracker]") {
  SegmentTracker tracker;
  tracker.start(nullptr, 4 * mib, 4);
  REQUIRE(tracker.next_slot() != nullptr);
  REQUIRE(tracker.fail(dma::fabric_error(-FI_EINVAL), 0, "fi_writemsg returned -22"));
  REQUIRE(tracker.finished());
  REQUIRE(tracker.outcome().error() == dma::fabric_error(FI_EINVAL));
}

TEST_CASE("a deadline while segments are posted waits for them, and keeps the deadline as the error",
          "[segment_tracker]") {
  SegmentTracker tracker;
  tracker.start(nullptr, 4 * mib, 2);
  std::vector<SegmentSlot*> posted = post_all_allowed(tracker, mib, 5);
  REQUIRE_FALSE(tracker.fail(dma::errc::timed_out));
  std::set<std::uint32_t> generations;
  tracker.for_each_in_flight([&](SegmentSlot& slot) { generations.insert(slot.generation); });
  REQUIRE(generations == std::set<std::uint32_t>{5});
  // The endpoint closes: the provider hands them back cancelled.
  REQUIRE_FALSE(tracker.returned(*posted[0], dma::fabric_error(FI_ECANCELED)));
  REQUIRE(tracker.returned(*posted[1], dma::fabric_error(FI_ECANCELED)));
  REQUIRE(tracker.outcome().error() == dma::errc::timed_out);
}

TEST_CASE("a post refused with -FI_EAGAIN asks for the same slot again", "[segment_tracker]") {
  SegmentTracker tracker;
  tracker.start(nullptr, 2 * mib, 2);
  SegmentSlot* slot = tracker.next_slot();
  REQUIRE(tracker.next_slot() == slot);  // nothing committed
  tracker.posted(*slot, mib, 0);
  SegmentSlot* second = tracker.next_slot();
  REQUIRE(second != slot);
  tracker.posted(*second, mib, 0);
  REQUIRE(tracker.next_slot() == nullptr);  // every byte posted
  REQUIRE(tracker.all_posted());
  REQUIRE_FALSE(tracker.finished());
}

TEST_CASE("every post in flight has a provider context of its own", "[segment_tracker]") {
  SegmentTracker tracker;
  tracker.start(nullptr, 64 * mib, SegmentTracker::max_window);
  std::set<void*> contexts;
  for (SegmentSlot* slot : post_all_allowed(tracker, mib)) {
    contexts.insert(slot->as_context());
    REQUIRE(SegmentSlot::from_context(slot->as_context()) == slot);
    REQUIRE(static_cast<void*>(&slot->head.provider_context) == slot->as_context());
  }
  REQUIRE(contexts.size() == SegmentTracker::max_window);
}

TEST_CASE("the window is clamped to at least one post and at most max_window", "[segment_tracker]") {
  SegmentTracker tracker;
  tracker.start(nullptr, 64 * mib, 0);
  REQUIRE(tracker.window() == 1);
  tracker.start(nullptr, 64 * mib, 1000);
  REQUIRE(tracker.window() == SegmentTracker::max_window);
}

TEST_CASE("a zero-length transfer is one post and finishes when it comes back", "[segment_tracker]") {
  SegmentTracker tracker;
  tracker.start(nullptr, 0, 4);
  REQUIRE_FALSE(tracker.all_posted());
  REQUIRE_FALSE(tracker.finished());
  SegmentSlot* slot = tracker.next_slot();
  REQUIRE(slot != nullptr);
  tracker.posted(*slot, 0, 0);
  REQUIRE(tracker.next_slot() == nullptr);
  REQUIRE(tracker.returned(*slot));
  REQUIRE(tracker.outcome().ok());
  REQUIRE(tracker.outcome()->bytes == 0);
}

TEST_CASE("a slot returned twice is counted as stray and changes nothing", "[segment_tracker]") {
  SegmentTracker tracker;
  tracker.start(nullptr, 2 * mib, 2);
  std::vector<SegmentSlot*> posted = post_all_allowed(tracker, mib);
  REQUIRE_FALSE(tracker.returned(*posted[0]));
  REQUIRE_FALSE(tracker.returned(*posted[0]));
  REQUIRE(tracker.stray_returns() == 1);
  REQUIRE(tracker.bytes_done() == mib);
  SegmentTracker other;
  other.start(nullptr, mib, 1);
  REQUIRE_FALSE(other.returned(*posted[1]));  // not one of its slots
  REQUIRE(other.stray_returns() == 1);
  REQUIRE(tracker.returned(*posted[1]));
}

TEST_CASE("random return orders and errors complete every transfer exactly once", "[segment_tracker]") {
  std::mt19937_64 random(18);
  SegmentTracker tracker;
  for (int round = 0; round < 2000; ++round) {
    const std::size_t segment = 1 + random() % 1000;
    const std::size_t total = random() % 20000;
    tracker.start(nullptr, total, 1 + random() % 20);
    std::vector<SegmentSlot*> in_flight;
    int completions = 0;
    bool failed = false;
    for (int step = 0; step < 100000 && completions == 0; ++step) {
      for (SegmentSlot* slot : post_all_allowed(tracker, segment))
        in_flight.push_back(slot);
      if (in_flight.empty()) break;
      const std::size_t pick = random() % in_flight.size();
      SegmentSlot* back = in_flight[pick];
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(pick));
      const bool error = random() % 50 == 0;
      failed = failed || error;
      const bool done = error ? tracker.returned(*back, dma::fabric_error(FI_EIO)) : tracker.returned(*back);
      if (done) ++completions;
      REQUIRE(done == (in_flight.empty() && tracker.finished()));
    }
    INFO("round " << round << ": " << total << " bytes in " << segment << "-byte posts");
    REQUIRE(completions == 1);
    REQUIRE(in_flight.empty());
    REQUIRE(tracker.outcome().ok() == !failed);
    if (!failed) REQUIRE(tracker.bytes_done() == total);
  }
}

TEST_CASE("a post handed back to go again counts as not posted, and the transfer finishes once it went again",
          "[segment_tracker]") {
  SegmentTracker tracker;
  int owner = 0;
  tracker.start(&owner, 4 * mib, 4);
  std::vector<SegmentSlot*> posted = post_all_allowed(tracker, mib);
  REQUIRE(posted.size() == 4);
  REQUIRE(tracker.all_posted());
  CHECK_FALSE(tracker.returned(*posted[0]));
  REQUIRE(tracker.hand_back(*posted[1]));
  CHECK_FALSE(tracker.all_posted());
  CHECK(tracker.bytes_posted() == 3 * mib);
  CHECK_FALSE(tracker.hand_back(*posted[1]));  // not in flight any more
  CHECK_FALSE(tracker.returned(*posted[2]));
  CHECK_FALSE(tracker.returned(*posted[3]));
  CHECK_FALSE(tracker.finished());  // a megabyte still waits to go again

  SegmentSlot* again = tracker.next_slot();
  REQUIRE(again != nullptr);
  tracker.posted(*again, mib, 1);
  CHECK(tracker.all_posted());
  CHECK(tracker.returned(*again));
  CHECK(tracker.outcome().ok());
  CHECK(tracker.outcome().value().bytes == 4 * mib);
  CHECK(tracker.bytes_done() == 4 * mib);
}

TEST_CASE("a failed transfer's posts are not handed back to go again", "[segment_tracker]") {
  SegmentTracker tracker;
  int owner = 0;
  tracker.start(&owner, 2 * mib, 2);
  std::vector<SegmentSlot*> posted = post_all_allowed(tracker, mib);
  REQUIRE(posted.size() == 2);
  CHECK_FALSE(tracker.returned(*posted[0], dma::errc::connection_lost));
  CHECK_FALSE(tracker.hand_back(*posted[1]));
  CHECK(tracker.returned(*posted[1], dma::errc::connection_lost));
  CHECK(tracker.outcome().error() == dma::errc::connection_lost);
}
