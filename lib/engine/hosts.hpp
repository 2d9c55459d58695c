// The protocols by which the engine's parts call back into their host, the engine (EngineImpl),
// as concepts. A part is a template on its host so that nothing stands between a CQ entry and its
// completion but inlined code; the concept says which member functions it may call, and the
// engine checks that it is a host of each kind (static_assert after EngineImpl). The unit tests'
// fake hosts are checked the same way where they are used.
//
// The CQ watcher's protocols (CqEventHost, CqDrainSink, CqReadSink) live beside it in
// lib/progress/cq_watcher.hpp: the progress layer cannot see this one.
#pragma once

#include "operation_state.hpp"

#include <rdma/fabric.h>

#include <sys/types.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

namespace dma::detail {

/// What the poster may do with a segmented transfer at the front of its peer's queue.
enum class SegmentStep : std::uint8_t {
  post,  ///< its next post is filled and may go now
  wait,  ///< not now: its window is full, or its last post (with immediate data) waits for the rest
  stop,  ///< it failed or was doomed with nothing in flight: take it out and complete it
};

/// A host that completes a queued transfer failed before its post: what the poster's
/// fail_queue(), fail_doomed() and mark_unreachable() call, and so all the ledger's sweep and
/// error sorting (sort_failure) need. A transfer that took some of its posts already completes
/// once they are back.
template <typename Host>
concept QueueFailHost = requires(Host& host, Operation* op, std::error_code ec, const std::string& detail) {
  host.fail_queued(op, ec, detail);
};

/// The poster's host. The poster owns the scheduling state (the round-robin, the queued and
/// in-flight counts); its host does the rest: the local descriptor, the libfabric post, the
/// bookkeeping of a posted transfer, a fresh AV entry, and the completion of a transfer that
/// failed here. A transfer that takes several posts (Operation::segments, segmenter.hpp) stays at
/// the front of its peer's queue until its last post is taken; its host says what may happen next.
template <typename Host>
concept PosterHost = QueueFailHost<Host> &&
    requires(Host& host, const Host& const_host, Operation& op, const Operation& const_op, Operation* op_pointer,
             Peer& peer, std::error_code ec, fi_addr_t address, bool more) {
  /// The local descriptor (or the segmented plan), before the post.
  { host.prepare(op) } -> std::same_as<std::error_code>;
  /// prepare() refused it: it completes with ec.
  host.fail_prepared(op_pointer, ec);
  /// The libfabric post: 0, -FI_EAGAIN or an error.
  { host.post(op, address, more) } -> std::same_as<ssize_t>;
  /// The bookkeeping of a posted transfer.
  host.posted(op);
  /// A fresh AV entry for a peer whose connection broke.
  { host.refresh(peer) } -> std::same_as<std::error_code>;
  /// Post now, wait for a return, or stop.
  { host.segment_step(op) } -> std::same_as<SegmentStep>;
  /// Another post of it can follow at once (for FI_MORE).
  { const_host.segment_continues(const_op) } -> std::same_as<bool>;
  { const_host.segment_all_posted(const_op) } -> std::same_as<bool>;
  /// SegmentStep::stop: it completes now.
  host.stop_segmented(op_pointer);
};

/// The shutdown's host: it fails queued transfers (through the poster), and besides
/// drains every CQ still returning transfers, settles a posted transfer whose posts never came
/// back once the endpoints are closed, schedules the next pass, and keeps itself alive for the
/// grace period's timer.
template <typename Host>
concept ShutdownHost = QueueFailHost<Host> && requires(Host& host, Operation* op) {
  /// Every CQ still returning transfers, once; how many operations it finished.
  { host.drain_cqs() } -> std::convertible_to<std::size_t>;
  /// The bookkeeping of a posted transfer the closed endpoints will never hand back.
  host.abandoned(op);
  /// After a step: something looks at the CQ again, or the close follows once idle.
  host.schedule_progress();
  { host.shared_from_this() } -> std::convertible_to<std::shared_ptr<Host>>;
};

}  // namespace dma::detail
