// Sorting error completions: which error a transfer reports and what it says of its peer.
#include "completion_error.hpp"
#include "../catch.hpp"
#include "ledger_rig.hpp"

#include <dma/error.hpp>

#include <asio/error.hpp>

#include <rdma/fi_errno.h>

#include <cerrno>

using dma::detail::Doom;
using dma::detail::ErrorSort;
using dma::detail::sort_error;
using dma::detail::state;
using Fate = ErrorSort::PeerFate;

TEST_CASE("a doomed transfer reports its doom whatever the provider says") {
  CHECK(sort_error(FI_ECANCELED, Doom::deadline).ec == dma::errc::timed_out);
  CHECK(sort_error(FI_EHOSTUNREACH, Doom::cancelled).ec == asio::error::operation_aborted);
  CHECK(sort_error(FI_EIO, Doom::shutdown).ec == dma::errc::shutdown);
  CHECK(sort_error(FI_EHOSTUNREACH, Doom::deadline).peer == Fate::untouched);
}

TEST_CASE("a broken connection reports connection_lost and reconnects without back-off") {
  for (int err : {FI_ECANCELED, FI_ENOTCONN, FI_ECONNRESET, FI_ECONNABORTED, EPIPE, FI_ESHUTDOWN}) {
    const ErrorSort sort = sort_error(err, Doom::none);
    CHECK(sort.ec == dma::errc::connection_lost);
    CHECK(sort.peer == Fate::reconnect);
  }
}

TEST_CASE("an unreachable host marks the peer unreachable with the fabric's error") {
  for (int err : {FI_EHOSTUNREACH, FI_ENETUNREACH}) {
    const ErrorSort sort = sort_error(err, Doom::none);
    CHECK(sort.ec == dma::fabric_error(err));
    CHECK(sort.peer == Fate::unreachable);
  }
  const ErrorSort other = sort_error(FI_EIO, Doom::none);
  CHECK(other.ec == dma::fabric_error(FI_EIO));
  CHECK(other.peer == Fate::untouched);
}

TEST_CASE("an unreachable error fails the peer's queued transfers and backs it off") {
  test::LedgerRig rig;
  auto* posted = rig.posted();
  auto* queued = rig.queued();
  rig.host->returned(posted);
  fi_cq_err_entry entry{};
  entry.err = FI_EHOSTUNREACH;
  dma::detail::finish_failed(posted, entry, "detail", rig.ledger, rig.poster, dma::detail::Log{}, *rig.host);
  const auto& finished = test::Record::get().finished;
  REQUIRE(finished.size() == 2);
  CHECK(finished[0].op == queued);
  CHECK(finished[1].op == posted);
  CHECK(finished[1].ec == dma::fabric_error(FI_EHOSTUNREACH));
  CHECK(rig.poster.marked_unreachable() == 1);
  CHECK(rig.ledger.outstanding() == 0);
}

TEST_CASE("a connection error makes the peer's next post reconnect") {
  test::LedgerRig rig;
  auto* posted = rig.posted();
  const dma::detail::PeerFlow& flow = state(*posted).peer->flow;
  rig.host->returned(posted);
  fi_cq_err_entry entry{};
  entry.err = FI_ECONNRESET;
  dma::detail::finish_failed(posted, entry, {}, rig.ledger, rig.poster, dma::detail::Log{}, *rig.host);
  REQUIRE(test::Record::get().finished.size() == 1);
  CHECK(test::Record::get().finished[0].ec == dma::errc::connection_lost);
  CHECK(flow.refresh);
  CHECK(!flow.connected);
  CHECK(rig.poster.marked_unreachable() == 0);
}

TEST_CASE("a doomed transfer's detail names its deadline or its cancellation, not the endpoint's close") {
  dma::detail::Operation op;
  dma::detail::OperationState& s = dma::detail::begin_state(op);
  s.accepted = std::chrono::steady_clock::time_point{} + std::chrono::seconds(5);
  s.deadline = s.accepted + std::chrono::milliseconds(1500);
  s.doom = Doom::deadline;
  CHECK(dma::detail::doom_detail(op) ==
        "posted, and not completed within its deadline of 1500ms; closing its endpoint handed it back");
  s.doom = Doom::cancelled;
  CHECK(dma::detail::doom_detail(op) == "cancelled while posted; closing its endpoint handed it back");
  s.doom = Doom::shutdown;
  CHECK(dma::detail::doom_detail(op).find("service closed") != std::string::npos);
  dma::detail::end_state(op);
}
