/// @file
/// RESP2 for the side channel's servers and clients: an incremental request parser with hard
/// limits (multibulk and inline commands, as redis-server accepts them), a reply parser, and
/// encoders. Parsers never allocate per byte and never read past their input; a request that
/// breaks a limit is a protocol error, after which a server closes the connection (as
/// redis-server does).
#pragma once

#include <dma/export.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dma::kv::resp {

/// What one request may be.
struct Limits {
  std::size_t max_inline = std::size_t{64} << 10;                               ///< an inline command's line, bytes
  std::size_t max_arguments = 64;                                               ///< elements of one multibulk request
  std::size_t max_bulk = std::size_t{64} << 20;                                 ///< one bulk string, bytes
  std::size_t max_request = (std::size_t{64} << 20) + (std::size_t{64} << 10);  ///< sum of one request's bulks
};

/// How far a parser got.
enum class Status {
  complete,    ///< `arguments` holds a command; `consumed` bytes of input were used
  incomplete,  ///< more input is needed; nothing was consumed
  error,       ///< the input breaks the protocol or a limit; `error` says how
};

/// What a parser did with its input.
struct Parsed {
  Status status = Status::incomplete;  ///< complete, incomplete or error
  std::size_t consumed = 0;            ///< complete: bytes of input the request or reply took
  std::string error;                   ///< error: what was wrong
  std::size_t needed = 0;              ///< incomplete: the request's whole length when the parser knows it
};

/// Parses the first request in input. On `complete`, arguments views input (valid while input is);
/// an empty line or an inline line of spaces is a complete command with no arguments.
DMA_EXPORT Parsed parse_request(std::string_view input, const Limits& limits, std::vector<std::string_view>& arguments);

/// One reply, as the client reads it. Strings view the parsed input.
struct Reply {
  /// The RESP2 types.
  enum class Type { simple, error, integer, bulk, nil, array };
  Type type = Type::nil;        ///< which of them
  std::string_view text;        ///< simple, error, bulk
  std::int64_t integer = 0;     ///< integer
  std::vector<Reply> elements;  ///< array

  /// True for an error reply.
  bool is_error() const noexcept { return type == Type::error; }
};

/// A reply that owns its bytes: what a client keeps of one after its input is gone.
struct Value {
  Reply::Type type = Reply::Type::nil;  ///< which of RESP2's types
  std::string text;                     ///< simple, error, bulk
  std::int64_t integer = 0;             ///< integer
  std::vector<Value> elements;          ///< array

  /// True for an error reply.
  bool is_error() const noexcept { return type == Reply::Type::error; }
};
/// A copy of `reply` that owns its bytes.
DMA_EXPORT Value to_value(const Reply& reply);

/// Parses the first reply in input (nesting at most `max_depth` arrays, `limits` as for requests).
DMA_EXPORT Parsed parse_reply(std::string_view input, const Limits& limits, Reply& reply, int max_depth = 4);

/// Appends a multibulk request of the given arguments.
DMA_EXPORT void encode_command(std::string& out, std::span<const std::string_view> arguments);
/// The header of a bulk string of `length` bytes (`$<length>\r\n`); the payload and "\r\n" follow.
DMA_EXPORT std::string bulk_header(std::size_t length);

DMA_EXPORT void append_simple(std::string& out, std::string_view text);    ///< `+text`
DMA_EXPORT void append_error(std::string& out, std::string_view text);     ///< `-text`; CR/LF become spaces
DMA_EXPORT void append_integer(std::string& out, std::int64_t value);      ///< `:value`
DMA_EXPORT void append_bulk(std::string& out, std::string_view text);      ///< `$<length>` and the text
DMA_EXPORT void append_nil(std::string& out);                              ///< `$-1`
DMA_EXPORT void append_array_header(std::string& out, std::size_t count);  ///< `*<count>`

/// ASCII-case-insensitive equality, for command names.
DMA_EXPORT bool iequals(std::string_view a, std::string_view b) noexcept;

}  // namespace dma::kv::resp
