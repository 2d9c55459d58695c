// RESP2 for the side-channel server and client: an incremental request parser with hard limits
// (multibulk and inline commands, as redis-server accepts them), a reply parser, and encoders.
// Parsers never allocate per byte and never read past their input; a request that breaks a limit
// is a protocol error, after which the connection is closed (as redis-server does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kv::resp {

/// What one request may be.
struct Limits {
  std::size_t max_inline = 64 * 1024;                             ///< an inline command's line, bytes
  std::size_t max_arguments = 64;                                 ///< elements of one multibulk request
  std::size_t max_bulk = std::size_t{64} << 20;                   ///< one bulk string, bytes
  std::size_t max_request = (std::size_t{64} << 20) + 64 * 1024;  ///< sum of one request's bulks
};

enum class Status {
  complete,    ///< `arguments` holds a command; `consumed` bytes of input were used
  incomplete,  ///< more input is needed; nothing was consumed
  error,       ///< the input breaks the protocol or a limit; `error` says how
};

struct Parsed {
  Status status = Status::incomplete;
  std::size_t consumed = 0;
  std::string error;
  std::size_t needed = 0;  ///< incomplete: the request's whole length when the parser knows it
};

/// Parses the first request in input. On `complete`, arguments views input (valid while input is);
/// an empty line or an inline line of spaces is a complete command with no arguments.
Parsed parse_request(std::string_view input, const Limits& limits, std::vector<std::string_view>& arguments);

/// One reply, as the client reads it. Strings view the parsed input.
struct Reply {
  enum class Type { simple, error, integer, bulk, nil, array };
  Type type = Type::nil;
  std::string_view text;  ///< simple, error, bulk
  std::int64_t integer = 0;
  std::vector<Reply> elements;

  bool is_error() const noexcept { return type == Type::error; }
};

/// Parses the first reply in input (nesting at most `max_depth` arrays, `limits` as for requests).
Parsed parse_reply(std::string_view input, const Limits& limits, Reply& reply, int max_depth = 4);

/// Appends a multibulk request of the given arguments.
void encode_command(std::string& out, std::span<const std::string_view> arguments);
/// The header of a bulk string of `length` bytes (`$<length>\r\n`); the payload and "\r\n" follow.
std::string bulk_header(std::size_t length);

void append_simple(std::string& out, std::string_view text);  ///< `+text`
void append_error(std::string& out, std::string_view text);   ///< `-text`; CR/LF become spaces
void append_integer(std::string& out, std::int64_t value);
void append_bulk(std::string& out, std::string_view text);
void append_nil(std::string& out);
void append_array_header(std::string& out, std::size_t count);

/// ASCII-case-insensitive equality, for command names.
bool iequals(std::string_view a, std::string_view b) noexcept;

}  // namespace kv::resp
