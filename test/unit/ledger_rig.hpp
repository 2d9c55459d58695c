// A rig for the engine's bookkeeping parts without a fabric: a peer table on a fake AV, a ledger
// bound to it, a poster and a reclaimer, and operations whose completions are recorded instead of
// delivered. Its Host is the poster's host and the shutdown's.
#pragma once

#include "ledger.hpp"
#include "operation_state.hpp"
#include "peer_table.hpp"
#include "poster.hpp"
#include "reclaimer.hpp"

#include <dma/transfer.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace test {

using dma::detail::Operation;

struct Finished {
  Operation* op;
  std::error_code ec;
  std::string message;
};

/// Every completion and every destroy() of the rig's operations, in order.
struct Record {
  std::vector<Finished> finished;
  std::vector<Operation*> destroyed;
  static Record& get() {
    static Record record;
    return record;
  }
};

inline const dma::detail::OperationFunctions recording_functions{
    [](Operation&) { return dma::errc{}; },
    [](Operation* op, dma::Outcome&& outcome) {
      Record::get().finished.push_back({op, outcome.error(), outcome.message()});
    },
    [](Operation* op) { Record::get().destroyed.push_back(op); },
    [](const Operation&) { return std::optional<dma::CacheableSpan>{}; },
    nullptr,
    nullptr,
};

struct LedgerRig {
  struct Host : std::enable_shared_from_this<Host> {
    explicit Host(LedgerRig& rig) : rig(rig) {}
    std::error_code prepare(Operation&) { return {}; }
    ssize_t post(Operation&, fi_addr_t, bool) { return 0; }
    void posted(Operation& op) noexcept { rig.reclaimer.posted(op); }
    std::error_code refresh(dma::detail::Peer&) { return {}; }
    void fail_queued(Operation* op, std::error_code ec, std::string detail) {
      rig.ledger.finish(op, ec, 0, std::move(detail));
    }
    // Whole transfers only: a segmented one never reaches this host.
    void fail_prepared(Operation* op, std::error_code ec) { fail_queued(op, ec, "preparing the post"); }
    dma::detail::SegmentStep segment_step(Operation&) { return dma::detail::SegmentStep::post; }
    bool segment_continues(const Operation&) const { return false; }
    bool segment_all_posted(const Operation&) const { return true; }
    void stop_segmented(Operation*) {}
    std::size_t drain_cqs() {
      ++drains;
      return 0;
    }
    void abandoned(Operation* op) noexcept { returned(op); }
    void returned(Operation* op) noexcept {
      ++returns;
      (void)rig.reclaimer.returned(*op);
      rig.poster.returned(dma::detail::state(*op).peer->flow);
    }
    void schedule_progress() { ++progress; }

    LedgerRig& rig;
    int drains = 0;
    int returns = 0;
    int progress = 0;
  };

  LedgerRig()
      : peers(
            FI_SOCKADDR_IN,
            [](std::span<const std::uint8_t>, fi_addr_t& handle) {
              handle = 7;
              return std::error_code{};
            },
            [](fi_addr_t) {}),
        ledger(std::chrono::hours(1)),
        reclaimer([](std::error_code& ec) {
          ec = std::make_error_code(std::errc::not_supported);
          return dma::Endpoint::Retired{};
        }) {
    ledger.bind(&peers);
    poster.set_limits({4, 4, std::chrono::hours(1), std::chrono::seconds(1), std::chrono::seconds(30)});
    Record::get() = {};
  }

  /// A submitted operation, not yet accepted: the engine took it, and its state began.
  Operation* submitted() {
    Operation& op = ops.emplace_back();
    dma::detail::begin_state(op);
    op.functions = &recording_functions;
    op.sequence = ledger.next_sequence();
    ledger.submitted();
    return &op;
  }
  /// An accepted operation, queued on its peer.
  Operation* queued() {
    Operation* op = submitted();
    std::error_code ec;
    dma::detail::Peer* peer = peers.acquire(1, address, ec);
    dma::detail::state(*op).peer = peer;
    ledger.accept(op, dma::detail::Clock::now());
    poster.enqueue(peer->flow, op);
    return op;
  }
  /// An accepted operation, posted (the queue is empty before).
  Operation* posted() {
    Operation* op = queued();
    poster.post_pending(*host);
    return op;
  }

  std::array<std::uint8_t, 16> address{2, 0, 0x1f, 0x90, 127, 0, 0, 1};
  dma::detail::PeerTable peers;
  dma::detail::Ledger ledger;
  dma::detail::Reclaimer reclaimer;
  dma::detail::Poster poster;
  std::deque<Operation> ops;
  std::shared_ptr<Host> host = std::make_shared<Host>(*this);
};

}  // namespace test
