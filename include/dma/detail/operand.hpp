// The one place a context's operand is resolved: every path (a transfer on one endpoint, a
// striped transfer, the callback layer) asks Operands through these functions, so they agree on
// which member wins (a list before a single buffer) and on every error.
#pragma once

#include <dma/detail/operation.hpp>
#include <dma/error.hpp>
#include <dma/transfer.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace dma::detail {

/// A context's operand for one transfer, resolved once, before the transfer is posted.
struct ResolvedOperand {
  errc error{};                 ///< errc{} when the operand is usable (no std::error_code on success)
  std::byte* buffer = nullptr;  ///< the contiguous operand; null when it is a list
  std::size_t length = 0;       ///< a write's source size, a read's requested length
  std::uint8_t lists = 0;       ///< OperandLists bits
};

/// Resolves context's operand for a transfer in `direction`; `read_length` is a read's length.
/// Asks each Operands member at most once: remote_segments(), then for a write sources() or
/// else source(), for a read landing() or else allocate(read_length).
template <TransferContext Context>
ResolvedOperand resolve_operand(Context& context, Direction direction, std::size_t read_length) {
  ResolvedOperand resolved;
  if constexpr (requires { Operands<Context>::remote_segments(context); }) {
    if (Operands<Context>::remote_segments(context)) resolved.lists |= remote_list;
  }
  if (direction == Direction::ToPeer) {
    if constexpr (requires { Operands<Context>::sources(context); }) {
      if (auto sources = Operands<Context>::sources(context)) {
        std::size_t total = 0;
        for (const auto& buffer : *sources) {
          if (buffer.size() > SIZE_MAX - total) {
            resolved.error = errc::operand_range_overflows;
            return resolved;
          }
          total += buffer.size();
        }
        resolved.lists |= local_list;
        resolved.length = total;
        return resolved;
      }
    }
    if constexpr (requires { Operands<Context>::source(context); }) {
      if (auto source = Operands<Context>::source(context)) {
        resolved.buffer = const_cast<std::byte*>(source->data());  // the provider only reads a write's source
        resolved.length = source->size();
        return resolved;
      }
    }
    resolved.error = errc::no_source;
    return resolved;
  }
  resolved.length = read_length;
  if constexpr (requires { Operands<Context>::landing(context); }) {
    if (auto buffers = Operands<Context>::landing(context)) {
      std::size_t total = 0;
      for (const auto& buffer : *buffers) {
        if (total >= read_length) break;
        total += std::min(buffer.size(), read_length - total);
      }
      if (total < read_length) {
        resolved.error = errc::landing_buffer_too_small;
        return resolved;
      }
      resolved.lists |= local_list;
      return resolved;
    }
  }
  if constexpr (requires { Operands<Context>::allocate(context, read_length); }) {
    if (auto landing = Operands<Context>::allocate(context, read_length)) {
      if (landing->size() < read_length) {
        resolved.error = errc::landing_buffer_too_small;
        return resolved;
      }
      resolved.buffer = landing->data();
      return resolved;
    }
  }
  resolved.error = errc::no_landing_buffer;
  return resolved;
}

/// A resolved list operand's buffers: a gather's sources (the provider only reads them) or a
/// scatter's landing buffers, the last one cut at `length`. Copies up to out.size() of them into
/// out and returns how many there are.
template <TransferContext Context>
std::size_t local_buffers(Context& context, Direction direction, std::size_t length,
                          std::span<std::span<std::byte>> out) {
  std::size_t count = 0;
  std::size_t left = length;
  auto take = [&](std::byte* data, std::size_t size) {
    if (count < out.size()) out[count] = {data, std::min(size, left)};
    left -= std::min(size, left);
    ++count;
  };
  if (direction == Direction::ToPeer) {
    if constexpr (requires { Operands<Context>::sources(context); }) {
      if (auto sources = Operands<Context>::sources(context)) {
        for (const auto& buffer : *sources)
          take(const_cast<std::byte*>(buffer.data()), buffer.size());
      }
    }
    return count;
  }
  if constexpr (requires { Operands<Context>::landing(context); }) {
    if (auto buffers = Operands<Context>::landing(context)) {
      for (const auto& buffer : *buffers) {
        if (left == 0) break;
        take(buffer.data(), buffer.size());
      }
    }
  }
  return count;
}

/// The context's remote segments; empty when it names none.
template <TransferContext Context>
std::span<const RemoteSegment> remote_segments(const Context& context) {
  if constexpr (requires { Operands<Context>::remote_segments(context); }) {
    if (auto segments = Operands<Context>::remote_segments(context)) return *segments;
  }
  return {};
}

/// The context's cacheable span, when it offers one.
template <TransferContext Context>
std::optional<CacheableSpan> cacheable_span(const Context& context) {
  if constexpr (requires { Operands<Context>::cacheable_span(context); }) {
    return Operands<Context>::cacheable_span(context);
  } else {
    return std::nullopt;
  }
}

}  // namespace dma::detail
