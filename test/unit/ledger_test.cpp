// The ledger's cancellation: a queued transfer completes at once, a posted one is doomed.
#include "ledger.hpp"
#include "../catch.hpp"
#include "ledger_rig.hpp"

#include <asio/error.hpp>

using Cancelled = dma::detail::Ledger::Cancelled;
using dma::detail::Doom;

TEST_CASE("cancelling a queued transfer completes it at once with operation_aborted") {
  test::LedgerRig rig;
  auto* op = rig.queued();
  CHECK(rig.ledger.cancel(op, op->sequence, dma::detail::CancelScope::queued_or_posted, rig.poster, rig.reclaimer) ==
        Cancelled::finished);
  REQUIRE(test::Record::get().finished.size() == 1);
  CHECK(test::Record::get().finished[0].ec == asio::error::operation_aborted);
  CHECK(rig.poster.queued() == 0);
  CHECK(rig.ledger.cancelled() == 1);
  CHECK(rig.ledger.outstanding() == 0);
}

TEST_CASE("cancelling a posted transfer dooms it and completes nothing yet") {
  test::LedgerRig rig;
  auto* op = rig.posted();
  CHECK(rig.ledger.cancel(op, op->sequence, dma::detail::CancelScope::queued_or_posted, rig.poster, rig.reclaimer) ==
        Cancelled::doomed);
  CHECK(dma::detail::state(*op).doom == Doom::cancelled);
  CHECK(rig.reclaimer.current_doomed() == 1);
  CHECK(test::Record::get().finished.empty());
  CHECK(rig.ledger.cancel(op, op->sequence, dma::detail::CancelScope::queued_or_posted, rig.poster, rig.reclaimer) ==
        Cancelled::nothing);
}

TEST_CASE("a cancel with a stale sequence or after completion does nothing") {
  test::LedgerRig rig;
  auto* op = rig.queued();
  CHECK(rig.ledger.cancel(op, op->sequence + 1, dma::detail::CancelScope::queued_or_posted, rig.poster,
                          rig.reclaimer) == Cancelled::nothing);
  CHECK(rig.poster.queued() == 1);
  rig.poster.post_pending(*rig.host);
  rig.host->returned(op);
  rig.ledger.succeed(op);
  CHECK(rig.ledger.cancel(op, op->sequence, dma::detail::CancelScope::queued_or_posted, rig.poster, rig.reclaimer) ==
        Cancelled::nothing);
  REQUIRE(test::Record::get().finished.size() == 1);
  CHECK(!test::Record::get().finished[0].ec);
}

TEST_CASE("a cancellation that allows no side effect ends a queued transfer only") {
  test::LedgerRig rig;
  auto* queued = rig.queued();
  CHECK(rig.ledger.cancel(queued, queued->sequence, dma::detail::CancelScope::queued, rig.poster, rig.reclaimer) ==
        Cancelled::finished);
  auto* posted = rig.posted();
  CHECK(rig.ledger.cancel(posted, posted->sequence, dma::detail::CancelScope::queued, rig.poster, rig.reclaimer) ==
        Cancelled::nothing);
  CHECK(dma::detail::state(*posted).doom == Doom::none);
}

TEST_CASE("Asio's cancellation types map to what may be ended") {
  using dma::detail::cancel_scope;
  using dma::detail::CancelScope;
  CHECK(cancel_scope(asio::cancellation_type::terminal) == CancelScope::queued_or_posted);
  CHECK(cancel_scope(asio::cancellation_type::partial) == CancelScope::queued_or_posted);
  CHECK(cancel_scope(asio::cancellation_type::total) == CancelScope::queued);
  CHECK(cancel_scope(asio::cancellation_type::all) == CancelScope::queued_or_posted);
  CHECK_FALSE(cancel_scope(asio::cancellation_type::none));
}
