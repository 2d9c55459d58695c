// Remote keys a Target requests for its registrations: drawn from the operating system's random
// source, one draw per key, so that no number of keys a peer sees tells it anything about another
// peer's keys (a seeded PRNG such as mt19937_64 is rebuilt from 312 of its outputs).
#pragma once

#include <cstdint>
#include <span>
#include <system_error>

namespace dma::detail {

/// Fills `out` from getrandom(2), retrying interrupted and short reads. Returns the errno of a
/// getrandom that failed otherwise (the bytes are then unspecified).
std::error_code fill_random(std::span<std::byte> out) noexcept;

/// One 64-bit key from getrandom(2); 0 with ec set (getrandom's errno) when the OS gives no
/// random bytes.
std::uint64_t random_key(std::error_code& ec) noexcept;

}  // namespace dma::detail
