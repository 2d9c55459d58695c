// What an error completion means for the engine: the error a failed transfer reports and what it
// says of its peer, on the classes of libfabric errors in cq_error.hpp. Sorting is pure
// (sort_error); finish_failed() applies a sort to the transfer and its peer.
#pragma once

#include "cq_error.hpp"
#include "hosts.hpp"
#include "ledger.hpp"
#include "log.hpp"
#include "operation_state.hpp"
#include "poster.hpp"

#include <rdma/fi_eq.h>

#include <string>
#include <system_error>

namespace dma::detail {

/// The error a transfer doomed for `doom` completes with: timed_out, operation_aborted or shutdown.
std::error_code doom_error(Doom doom) noexcept;

/// What a doomed transfer's outcome says: its deadline (with its length) or its cancellation,
/// and that closing its endpoint handed it back (not the close's FI_ECANCELED).
std::string doom_detail(const Operation& op);

/// What an error completion means for its transfer and its peer.
struct ErrorSort {
  enum class PeerFate : std::uint8_t {
    untouched,    ///< a doomed transfer, or an error that says nothing of the peer
    reconnect,    ///< the connection broke: the next transfer reconnects at once, without back-off
    unreachable,  ///< the peer cannot be reached: mark it unreachable unless it backs off already
  };
  std::error_code ec;
  PeerFate peer = PeerFate::untouched;
};

/// Sorts an error completion with libfabric error err of a transfer doomed for `doom` (or not):
/// a doomed transfer reports its doom whatever the provider says.
ErrorSort sort_error(int err, Doom doom) noexcept;

/// Applies what an error completion of op says about its peer: a lost connection marks it for a
/// reconnect (logged once per teardown), an unreachable peer is marked so and has its queue
/// failed (through host, which completes them). Returns the sort, whose error the transfer reports.
template <QueueFailHost Host>
ErrorSort sort_failure(Operation* op, const fi_cq_err_entry& entry, const std::string& detail, Poster& poster,
                       const Log& log, Host& host) {
  const ErrorSort sort = sort_error(entry.err, state(*op).doom);
  Peer& peer = *state(*op).peer;
  PeerFlow& flow = peer.flow;
  if (sort.peer == ErrorSort::PeerFate::reconnect) {
    if (!flow.refresh) {
      log(LogLevel::info, [&] {
        return "connection lost: peer " + encode_hex(peer.address) + ": " + fi_strerror(entry.err) +
               " (err=" + std::to_string(entry.err) + ", prov_errno=" + std::to_string(entry.prov_errno) +
               "); the next transfer reconnects";
      });
    }
    flow.refresh = true;
    flow.connected = false;
  } else if (sort.peer == ErrorSort::PeerFate::unreachable) {
    const auto now = Clock::now();
    if (!flow.backing_off(now)) poster.mark_unreachable(flow, now, sort.ec, detail, host);
  }
  return sort;
}

/// Completes op, which the provider handed back with the error entry, by its sort (sort_failure).
template <QueueFailHost Host>
void finish_failed(Operation* op, const fi_cq_err_entry& entry, std::string detail, Ledger& ledger, Poster& poster,
                   const Log& log, Host& host) {
  const ErrorSort sort = sort_failure(op, entry, detail, poster, log, host);
  ledger.finish(op, sort.ec, entry.prov_errno, std::move(detail));
}

}  // namespace dma::detail
