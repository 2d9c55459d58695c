// The reclaimer: hands back posted transfers the provider will not return by itself. tcp and
// efa-direct cannot cancel a posted RMA, and on tcp;ofi_rxm 1.17 fi_av_remove does not return
// the writes posted to a frozen or cut-off peer either; only closing the endpoint does. So when a
// posted transfer is doomed (past its deadline, cancelled), new work moves to a fresh endpoint
// (with a completion queue of its own) on the same domain and address vector, and the old one is
// closed as soon as it holds nothing but doomed transfers, or after a short grace at the latest:
// a doomed transfer never waits for the others' deadlines. The provider returns what the closed
// endpoint held to its queue; the doomed ones complete then, and the engine posts the others again
// on the fresh endpoint (docs/design.md, "Handing back a posted transfer").
// Where closing may hand a half-received read back twice (lib/engine/connection_cut.hpp), the old
// endpoint's connections to the peers of its reads are cut first.
#pragma once

#include <dma/detail/fid.hpp>
#include "operation_state.hpp"
#include "segmenter.hpp"

#include <dma/endpoint.hpp>
#include <dma/metrics.hpp>

#include <rdma/fi_endpoint.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <system_error>
#include <vector>

namespace dma::detail {

class Reclaimer {
 public:
  /// Opens the fresh endpoint and returns the one it replaces (Endpoint::replace_endpoint).
  using ReplaceFn = std::function<Endpoint::Retired(std::error_code& ec)>;
  /// Adds to `peers` the address of every peer a read posted on endpoint `generation` still goes
  /// to (asked only with cut_reads, when an endpoint closes with transfers that are not doomed).
  using ReadPeersFn = std::function<void(std::uint32_t generation, std::vector<std::vector<std::uint8_t>>& peers)>;
  using Clock = std::chrono::steady_clock;

  /// At most this many replaced endpoints wait to be closed at once; beyond it, doomed transfers
  /// on the current endpoint wait for a slot.
  static constexpr std::size_t max_retiring = 8;
  /// Progress calls on a replaced endpoint's CQ between cutting its connections and closing it.
  static constexpr int progress_passes_after_cut = 4;
  /// How long a replaced endpoint waits for its transfers that are not doomed before it closes
  /// anyway: a healthy peer's transfers complete well within it and are not posted twice; the
  /// rest are handed back by the close and posted again. It bounds how long a cancelled or expired
  /// transfer waits for the others.
  static constexpr std::chrono::milliseconds close_grace{100};

  /// With `cut_reads`, a replaced endpoint's connections to the peers of its doomed reads are shut
  /// down, and the endpoint progressed, before it closes.
  explicit Reclaimer(ReplaceFn replace, bool cut_reads = false, ReadPeersFn read_peers = {})
      : replace_(std::move(replace)), read_peers_(std::move(read_peers)), cut_reads_(cut_reads) {}

  /// The generation posts go to now.
  std::uint32_t current() const noexcept { return current_.generation; }
  /// op was handed to the provider on the current endpoint.
  void posted(Operation& op) noexcept {
    state(op).generation = current_.generation;
    ++current_.in_flight;
  }
  /// The provider handed op back (a CQ entry arrived for it). True when that leaves a replaced
  /// endpoint holding only doomed transfers: step() closes it.
  bool returned(const Operation& op) noexcept {
    if (state(op).generation == current_.generation) {
      --current_.in_flight;
      if (state(op).doom != Doom::none) --current_.doomed;
      return false;
    }
    Generation& g = retiring_of(state(op).generation);
    --g.in_flight;
    if (state(op).doom != Doom::none) --g.doomed;
    return !g.closed && g.in_flight == g.doomed;
  }
  /// One post of a segmented transfer was handed to the provider: the generation it went to.
  std::uint32_t posted_segment() noexcept {
    ++current_.in_flight;
    return current_.generation;
  }
  /// The provider handed back a post of a segmented transfer (doomed or not) made on
  /// `generation`; true as returned(op).
  bool returned_segment(std::uint32_t generation, bool doomed) noexcept {
    Generation& g = generation == current_.generation ? current_ : retiring_of(generation);
    --g.in_flight;
    if (doomed) --g.doomed;
    return &g != &current_ && !g.closed && g.in_flight == g.doomed;
  }
  /// op is posted and must be handed back as soon as possible (every post of a segmented one
  /// in flight); a second doom keeps the first reason.
  void doom(Operation& op, Doom why) noexcept;
  /// Whether op's endpoint is closed: its CQ entries must not go through fi_cq_strerror (rxm
  /// reads the closed endpoint's state there).
  bool closed(const Operation& op) const noexcept { return closed(state(op).generation); }
  /// Whether endpoint `generation` is closed.
  bool closed(std::uint32_t generation) const noexcept;

  /// Replaces the current endpoint when a doomed transfer is on it, and closes every replaced one
  /// that holds only doomed transfers, or whose grace is over at `now`. Returns true when it
  /// closed one (its CQ now holds entries).
  bool step(std::error_code& ec, Clock::time_point now = Clock::now());
  /// Whether a replaced endpoint still open has waited its whole grace at `now` (step() closes it).
  bool grace_over(Clock::time_point now) const noexcept {
    for (const Generation& g : retiring_)
      if (!g.closed && now - g.replaced_at >= close_grace) return true;
    return false;
  }
  /// Runs f(cq) for the completion queue of every replaced endpoint that may still return entries.
  template <typename F>
  void for_each_retired_cq(F&& f) {
    for (Generation& g : retiring_)
      if (g.in_flight != 0) f(g.cq.get());
  }
  /// Drops the replaced endpoints whose transfers have all come back, closing their queues.
  void collect() noexcept;
  /// Closes every replaced endpoint (shutdown) and marks the current one closed, for the engine
  /// closes it itself right after. With cut_reads, the current endpoint's connections to the peers
  /// of its reads are cut first and `current_cq` progressed: a read half received from a frozen
  /// peer would otherwise be handed back twice by that close.
  void close_all(fid_cq* current_cq) noexcept;
  /// Closes the replaced endpoints' queues too (before the domain closes).
  void clear() noexcept { retiring_.clear(); }

  std::size_t retiring() const noexcept { return retiring_.size(); }
  std::uint64_t replacements() const noexcept { return replacements_; }
  std::size_t current_doomed() const noexcept { return current_.doomed; }
  /// Copies its counter into its Metrics field.
  void report(Metrics& m) const noexcept { m.endpoint_replacements = replacements_; }

 private:
  struct Generation {
    std::uint32_t generation = 0;
    std::size_t in_flight = 0;
    std::size_t doomed = 0;
    bool closed = false;
    Clock::time_point replaced_at{};
    Fid<fid_ep> endpoint;                               // replaced endpoints only; the current ones are the Endpoint's
    Fid<fid_cq> cq;                                     // closed after the endpoint
    std::vector<std::uint64_t> sockets;                 // open when it was replaced, or at close_all (cut_reads_)
    std::vector<std::vector<std::uint8_t>> read_peers;  // of its doomed reads (cut_reads_)
  };
  void close(Generation& g) noexcept;
  /// Cuts g's connections to the peers of its reads (those posted and not doomed asked of
  /// read_peers_), then progresses `cq`.
  void cut_reads(Generation& g, fid_cq* cq) noexcept;
  void doom_post(const Operation& op, std::uint32_t generation) noexcept;
  Generation& retiring_of(std::uint32_t generation) noexcept;
  const Generation* find(std::uint32_t generation) const noexcept;

  ReplaceFn replace_;
  ReadPeersFn read_peers_;
  bool cut_reads_ = false;
  Generation current_;
  std::vector<Generation> retiring_;
  std::uint64_t replacements_ = 0;
};

}  // namespace dma::detail
