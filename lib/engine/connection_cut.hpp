// Cutting a replaced endpoint's connections before it closes. tcp before libfabric 1.18 hands an
// RMA read back twice when its endpoint closes while the read's response is half received (the
// peer stopped mid-response): once from its queue of reads, then again as the receive in progress,
// the second time with the entry already freed and its context zeroed, and rxm dereferences that
// null context (docs/notes/rxm-close-crash.md). A connection the peer ends, or that reads end of
// stream, fails the read in progress once, cleanly. So before such an endpoint closes, the sockets
// it holds to the peers of its doomed reads are shut down and the endpoint progressed once more.
#pragma once

#include <dma/configuration.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dma::detail {

/// Whether closing an endpoint of this provider may hand back a half-received read twice.
bool closing_frees_reads_twice(Provider provider) noexcept;

/// The inodes of the process's open sockets (from /proc/self/fd), sorted; empty if unreadable.
std::vector<std::uint64_t> socket_inodes();

/// Shuts down, both ways, every connected socket among `sockets` (inodes) whose peer address is one
/// of `peers` (FI_SOCKADDR_IN or FI_SOCKADDR_IN6 bytes). Returns how many it shut down.
std::size_t shut_down_connections(std::span<const std::uint64_t> sockets,
                                  std::span<const std::vector<std::uint8_t>> peers) noexcept;

/// Whether the socket address `peer` (getpeername) is the fabric address `address`.
bool same_socket_address(const void* peer, std::size_t peer_length, std::span<const std::uint8_t> address) noexcept;

}  // namespace dma::detail
