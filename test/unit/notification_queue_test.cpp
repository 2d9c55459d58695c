// The target's notification ring: bounded, in order, and a loss reported where it happened.
#include "notification_queue.hpp"
#include "../catch.hpp"

#include <cstdint>
#include <deque>
#include <random>
#include <stdexcept>
#include <variant>

using dma::detail::Notification;
using dma::detail::NotificationQueue;
using Popped = NotificationQueue::Popped;

namespace {

Notification numbered(std::uint64_t value) { return {value, 0, 0}; }

// The next pop's notification value; fails the test on anything else.
std::uint64_t next_value(NotificationQueue& queue) {
  Notification n;
  std::uint64_t lost = 0;
  REQUIRE(queue.pop(n, lost) == Popped::notification);
  return n.data;
}

std::uint64_t next_loss(NotificationQueue& queue) {
  Notification n;
  std::uint64_t lost = 0;
  REQUIRE(queue.pop(n, lost) == Popped::lost);
  return lost;
}

}  // namespace

TEST_CASE("10,000 notifications through a queue drained as they come arrive in order with their values",
          "[notification_queue]") {
  NotificationQueue queue(64);
  std::uint64_t expected = 0;
  Notification n;
  std::uint64_t lost = 0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    REQUIRE(queue.push({0xabcd0000 + i, 64, 3}));
    if (i % 7 != 6 && i != 9999) continue;
    while (queue.pop(n, lost) == Popped::notification) {
      REQUIRE(n.data == 0xabcd0000 + expected++);
      REQUIRE(n.length == 64);
      REQUIRE(n.flags == 3);
    }
  }
  REQUIRE(expected == 10000);
  REQUIRE(queue.overflows() == 0);
}

TEST_CASE("notifications that arrive while nobody waits are kept up to the capacity", "[notification_queue]") {
  NotificationQueue queue(4);
  for (std::uint64_t i = 0; i < 4; ++i)
    REQUIRE(queue.push(numbered(i)));
  REQUIRE(queue.size() == 4);
  for (std::uint64_t i = 0; i < 4; ++i)
    REQUIRE(next_value(queue) == i);
  REQUIRE_FALSE(queue.ready());
}

TEST_CASE("a full queue drops and counts, and the next waiter learns of it after the kept ones",
          "[notification_queue]") {
  NotificationQueue queue(2);
  REQUIRE(queue.push(numbered(1)));
  REQUIRE(queue.push(numbered(2)));
  REQUIRE_FALSE(queue.push(numbered(3)));
  REQUIRE_FALSE(queue.push(numbered(4)));
  REQUIRE(queue.overflows() == 2);
  REQUIRE(next_value(queue) == 1);
  REQUIRE(queue.push(numbered(5)));  // room again: 5 comes after the loss
  REQUIRE(next_value(queue) == 2);
  REQUIRE(next_loss(queue) == 2);
  REQUIRE(next_value(queue) == 5);
  REQUIRE_FALSE(queue.ready());
  Notification n;
  std::uint64_t lost = 0;
  REQUIRE(queue.pop(n, lost) == Popped::nothing);
}

TEST_CASE("a loss with nothing after it is reported once", "[notification_queue]") {
  NotificationQueue queue(1);
  REQUIRE(queue.push(numbered(1)));
  REQUIRE_FALSE(queue.push(numbered(2)));
  REQUIRE(next_value(queue) == 1);
  REQUIRE(queue.ready());
  REQUIRE(next_loss(queue) == 1);
  REQUIRE_FALSE(queue.ready());
  REQUIRE(queue.overflows() == 1);
}

TEST_CASE("random pushes and pops match a model queue with losses in place", "[notification_queue]") {
  std::mt19937_64 random(18);
  for (int round = 0; round < 200; ++round) {
    const std::size_t capacity = 1 + random() % 8;
    NotificationQueue queue(capacity);
    std::deque<std::variant<std::uint64_t, std::monostate>> model;  // values, and a marker per loss run
    std::size_t held = 0;
    std::uint64_t next = 0;
    std::uint64_t dropped = 0;
    std::uint64_t reported = 0;
    for (int step = 0; step < 2000; ++step) {
      if (random() % 3 != 0) {
        const bool kept = queue.push(numbered(next));
        REQUIRE(kept == (held < capacity));
        if (kept) {
          model.emplace_back(next);
          ++held;
        } else {
          ++dropped;
          if (model.empty() || !std::holds_alternative<std::monostate>(model.back()))
            model.emplace_back(std::monostate{});
        }
        ++next;
        continue;
      }
      Notification n;
      std::uint64_t lost = 0;
      const Popped popped = queue.pop(n, lost);
      if (model.empty()) {
        REQUIRE(popped == Popped::nothing);
      } else if (std::holds_alternative<std::monostate>(model.front())) {
        REQUIRE(popped == Popped::lost);
        reported += lost;
        model.pop_front();
      } else {
        REQUIRE(popped == Popped::notification);
        REQUIRE(n.data == std::get<std::uint64_t>(model.front()));
        model.pop_front();
        --held;
      }
    }
    Notification n;
    std::uint64_t lost = 0;
    for (Popped p; (p = queue.pop(n, lost)) != Popped::nothing;)
      if (p == Popped::lost) reported += lost;
    REQUIRE(reported == dropped);
    REQUIRE(queue.overflows() == dropped);
  }
}

TEST_CASE("a queue of capacity 0 is refused", "[notification_queue]") {
  REQUIRE_THROWS_AS(NotificationQueue(0), std::invalid_argument);
}
