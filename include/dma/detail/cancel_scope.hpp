// What an Asio cancellation type lets the engine end: a queued transfer only, or a posted one too.
#pragma once

#include <asio/cancellation_type.hpp>

#include <cstdint>
#include <optional>

namespace dma::detail {

/// What a cancellation may end (asynchronous::FabricService's "Per-Operation Cancellation").
enum class CancelScope : std::uint8_t {
  queued,            ///< only a transfer not yet posted: no side effect (Asio's `total`)
  queued_or_posted,  ///< a posted one too, by handing it back: a write may have landed (`terminal`, `partial`)
};

/// The scope an Asio cancellation type asks for; none when it asks for nothing.
inline std::optional<CancelScope> cancel_scope(asio::cancellation_type type) noexcept {
  if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial)) != asio::cancellation_type::none)
    return CancelScope::queued_or_posted;
  if ((type & asio::cancellation_type::total) != asio::cancellation_type::none) return CancelScope::queued;
  return std::nullopt;
}

}  // namespace dma::detail
