// What every runner shares: the peer, the initiator's buffer, the run length, and how both sides
// open their endpoints; plus one transfer's context and its request.
#pragma once

#include "types.hpp"

#include <dma/dma.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>

namespace bench {

inline Clock::duration span_of(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

/// The initiator's buffers: plain pages, or (--hugepages) 2 MiB-aligned memory that the kernel is
/// asked to back with transparent huge pages.
class LocalBuffer {
 public:
  LocalBuffer(std::size_t size, bool huge);
  ~LocalBuffer();
  LocalBuffer(const LocalBuffer&) = delete;
  LocalBuffer& operator=(const LocalBuffer&) = delete;
  std::span<std::byte> bytes() const { return {data_, size_}; }

 private:
  std::size_t size_ = 0, mapped_ = 0;
  std::byte* base_ = nullptr;
  std::byte* data_ = nullptr;
};

struct Setup {
  dma::Configuration base;  ///< --config's, or the defaults
  dma::Advertisement peer;
  std::chrono::nanoseconds spin_budget{std::chrono::microseconds(50)};
  std::string bind;
  std::span<std::byte> local;
  double duration = 0.2;  ///< seconds per run
  int max_depth = 64;

  /// What both sides open their endpoints with: the same CQ (wait object, size) and credits,
  /// enough of them for the deepest depth.
  dma::Configuration configuration(Wait wait, std::size_t endpoints = 1) const {
    dma::Configuration c = base;
    c.endpoints = endpoints;
    c.bind = bind;
    c.wait_mode = wait_mode(wait);
    c.spin_budget = spin_budget;
    c.max_in_flight = std::max(c.max_in_flight.value_or(64), static_cast<std::size_t>(max_depth));
    return c;
  }
};

/// One transfer's context: its lane's slice of the local buffer and when it was submitted.
struct Slice {
  std::span<std::byte> bytes;
  Clock::time_point started;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t) const { return bytes; }
};

/// Lane `lane` of a point: its own slice locally and in the peer's region.
inline dma::TransferRequest<Slice> request_for(const Setup& setup, const Point& point, int lane) {
  dma::TransferRequest<Slice> r;
  r.client_id = 1;
  r.peer_address = setup.peer.address;
  r.remote_key = setup.peer.remote_key;
  r.remote_address = setup.peer.remote_address + static_cast<std::uint64_t>(lane) * point.size;
  r.direction = point.direction;
  r.length = point.size;
  r.caller_context.bytes = setup.local.subspan(static_cast<std::size_t>(lane) * point.size, point.size);
  return r;
}

inline void record(Sample& sample, const dma::Outcome& outcome, Clock::time_point started, bool latency) {
  ++sample.transfers;
  if (!outcome) ++sample.errors;
  if (latency) {
    sample.latencies_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - started).count());
  }
}

}  // namespace bench
