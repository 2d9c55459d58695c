// The wait-mode policy: what follows a pass in each mode, and fd mode's "poll once more" rule.
#include "wait_policy.hpp"
#include "../catch.hpp"

#include <chrono>
#include <thread>

using dma::WaitMode;
using dma::detail::WaitPolicy;
using Next = WaitPolicy::Next;
using namespace std::chrono_literals;

namespace {

WaitPolicy with_fd(WaitMode mode, std::chrono::nanoseconds budget = 50us) {
  WaitPolicy policy(mode, budget, WaitPolicy::WithoutFd::poll);
  policy.set_fd(true);
  return policy;
}

}  // namespace

TEST_CASE("fd mode arms the fd after a pass unless the pass asks for one more look", "[unit][wait]") {
  WaitPolicy policy = with_fd(WaitMode::fd);
  CHECK(policy.after_pass(false) == Next::arm);
  CHECK(policy.after_pass(true) == Next::poll);
  policy.note_activity();  // fd mode never spins
  CHECK(policy.after_pass(false) == Next::arm);
}

TEST_CASE("a pass that reaped polls once more only while an older transfer is in flight", "[unit][wait]") {
  // Under load: 64 in flight, the pass posted 16 of them after reaping 16.
  CHECK(WaitPolicy::poll_once_more(true, 64, 16));
  // One transfer at a time: the pass reaped one and posted the next, which is all that is in flight.
  CHECK_FALSE(WaitPolicy::poll_once_more(true, 1, 1));
  // A whole window completed at once and was posted again by this pass.
  CHECK_FALSE(WaitPolicy::poll_once_more(true, 64, 64));
  // A pass that found nothing never asks for more.
  CHECK_FALSE(WaitPolicy::poll_once_more(false, 64, 0));
}

TEST_CASE("busy_poll polls after every pass, with or without an fd", "[unit][wait]") {
  WaitPolicy policy(WaitMode::busy_poll, 50us, WaitPolicy::WithoutFd::backstop);
  CHECK(policy.after_pass(false) == Next::poll);
  policy.set_fd(true);
  CHECK(policy.after_pass(false) == Next::poll);
}

TEST_CASE("without a wait fd an initiator polls and a target leaves it to the backstop", "[unit][wait]") {
  WaitPolicy initiator(WaitMode::fd, 50us, WaitPolicy::WithoutFd::poll);
  WaitPolicy target(WaitMode::adaptive, 50us, WaitPolicy::WithoutFd::backstop);
  CHECK(initiator.after_pass(false) == Next::poll);
  CHECK(target.after_pass(false) == Next::backstop);
  CHECK(target.after_pass(true) == Next::backstop);
}

TEST_CASE("adaptive polls while the last activity is within the spin budget, then arms", "[unit][wait]") {
  WaitPolicy policy = with_fd(WaitMode::adaptive, 1h);
  CHECK(policy.after_pass(false) == Next::arm);  // no activity yet
  policy.note_activity();
  CHECK(policy.after_pass(false) == Next::poll);

  WaitPolicy short_budget = with_fd(WaitMode::adaptive, 1ns);
  short_budget.note_activity();
  std::this_thread::sleep_for(1ms);
  CHECK(short_budget.after_pass(false) == Next::arm);
  CHECK(short_budget.after_pass(true) == Next::poll);
}
