#include <dma/kv/resp.hpp>

#include <algorithm>
#include <charconv>

namespace dma::kv::resp {
namespace {

// The longest header line (`*<n>`, `$<n>`, `:<n>`) worth looking at: a sign and 19 digits.
constexpr std::size_t max_header = 24;

enum class Line { found, incomplete, too_long };

// Finds "\r\n" at or after `at`, looking at most `limit` bytes; the line is [at, end).
Line find_line(std::string_view input, std::size_t at, std::size_t limit, std::size_t& end) {
  const std::size_t stop = std::min(input.size(), at + limit + 2);
  for (std::size_t i = at; i + 1 < stop; ++i) {
    if (input[i] == '\r' && input[i + 1] == '\n') {
      end = i;
      return Line::found;
    }
  }
  return stop - at >= limit + 2 ? Line::too_long : Line::incomplete;
}

bool parse_integer(std::string_view text, std::int64_t& value) {
  if (text.empty() || text.size() > 20) return false;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (*first == '+') return false;
  const auto [ptr, ec] = std::from_chars(first, last, value);
  return ec == std::errc() && ptr == last;
}

std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text.substr(0, 16))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

Parsed fail(std::string message) { return Parsed{Status::error, 0, "Protocol error: " + std::move(message)}; }

// One `<prefix><integer>\r\n` header at `at`; `at` moves past it.
Status read_header(std::string_view input, std::size_t& at, std::int64_t& value, std::string& error) {
  std::size_t end = 0;
  switch (find_line(input, at + 1, max_header, end)) {
    case Line::incomplete:
      return Status::incomplete;
    case Line::too_long:
      error = "invalid length header";
      return Status::error;
    case Line::found:
      break;
  }
  if (!parse_integer(input.substr(at + 1, end - at - 1), value)) {
    error = "invalid length '" + printable(input.substr(at + 1, end - at - 1)) + "'";
    return Status::error;
  }
  at = end + 2;
  return Status::complete;
}

Parsed parse_multibulk(std::string_view input, const Limits& limits, std::vector<std::string_view>& arguments) {
  std::size_t at = 0;
  std::int64_t count = 0;
  std::string error;
  if (auto s = read_header(input, at, count, error); s != Status::complete)
    return {s, 0, s == Status::error ? "Protocol error: " + error : ""};
  if (count <= 0) return {Status::complete, at, {}};
  if (static_cast<std::uint64_t>(count) > limits.max_arguments) {
    return fail("too many arguments (" + std::to_string(count) + ", limit " + std::to_string(limits.max_arguments) +
                ")");
  }
  std::size_t total = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    if (at >= input.size()) return {Status::incomplete, 0, {}};
    if (input[at] != '$') return fail("expected '$', got '" + printable(input.substr(at, 1)) + "'");
    std::int64_t length = 0;
    if (auto s = read_header(input, at, length, error); s != Status::complete)
      return {s, 0, s == Status::error ? "Protocol error: " + error : ""};
    if (length < 0 || static_cast<std::uint64_t>(length) > limits.max_bulk) {
      return fail("invalid bulk length " + std::to_string(length) + " (limit " + std::to_string(limits.max_bulk) + ")");
    }
    const auto n = static_cast<std::size_t>(length);
    total += n;
    if (total > limits.max_request) return fail("request larger than " + std::to_string(limits.max_request) + " bytes");
    if (input.size() - at < n + 2) return {Status::incomplete, 0, {}, at + n + 2};
    if (input[at + n] != '\r' || input[at + n + 1] != '\n') return fail("bulk string not terminated by CRLF");
    arguments.push_back(input.substr(at, n));
    at += n + 2;
  }
  return {Status::complete, at, {}};
}

Parsed parse_inline(std::string_view input, const Limits& limits, std::vector<std::string_view>& arguments) {
  const std::size_t window = std::min(input.size(), limits.max_inline + 1);
  const std::size_t newline = input.substr(0, window).find('\n');
  if (newline == std::string_view::npos) {
    if (input.size() > limits.max_inline)
      return fail("too big inline request (limit " + std::to_string(limits.max_inline) + " bytes)");
    return {Status::incomplete, 0, {}};
  }
  std::string_view line = input.substr(0, newline);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::size_t at = 0;
  while (at < line.size()) {
    const auto start = line.find_first_not_of(" \t", at);
    if (start == std::string_view::npos) break;
    const auto stop = std::min(line.find_first_of(" \t", start), line.size());
    if (arguments.size() == limits.max_arguments) {
      arguments.clear();
      return fail("too many arguments (limit " + std::to_string(limits.max_arguments) + ")");
    }
    arguments.push_back(line.substr(start, stop - start));
    at = stop;
  }
  return {Status::complete, newline + 1, {}};
}

Parsed parse_reply_at(std::string_view input, std::size_t& at, const Limits& limits, Reply& reply, int depth) {
  if (at >= input.size()) return {Status::incomplete, 0, {}};
  const char kind = input[at];
  std::string error;
  switch (kind) {
    case '+':
    case '-': {
      std::size_t end = 0;
      const auto line = find_line(input, at + 1, limits.max_inline, end);
      if (line == Line::incomplete) return {Status::incomplete, 0, {}};
      if (line == Line::too_long) return fail("status line too long");
      reply.type = kind == '+' ? Reply::Type::simple : Reply::Type::error;
      reply.text = input.substr(at + 1, end - at - 1);
      at = end + 2;
      return {Status::complete, at, {}};
    }
    case ':': {
      if (auto s = read_header(input, at, reply.integer, error); s != Status::complete)
        return {s, 0, s == Status::error ? "Protocol error: " + error : ""};
      reply.type = Reply::Type::integer;
      return {Status::complete, at, {}};
    }
    case '$': {
      std::int64_t length = 0;
      if (auto s = read_header(input, at, length, error); s != Status::complete)
        return {s, 0, s == Status::error ? "Protocol error: " + error : ""};
      if (length == -1) {
        reply.type = Reply::Type::nil;
        return {Status::complete, at, {}};
      }
      if (length < 0 || static_cast<std::uint64_t>(length) > limits.max_bulk)
        return fail("invalid bulk length " + std::to_string(length));
      const auto n = static_cast<std::size_t>(length);
      if (input.size() - at < n + 2) return {Status::incomplete, 0, {}, at + n + 2};
      if (input[at + n] != '\r' || input[at + n + 1] != '\n') return fail("bulk string not terminated by CRLF");
      reply.type = Reply::Type::bulk;
      reply.text = input.substr(at, n);
      at += n + 2;
      return {Status::complete, at, {}};
    }
    case '*': {
      std::int64_t count = 0;
      if (auto s = read_header(input, at, count, error); s != Status::complete)
        return {s, 0, s == Status::error ? "Protocol error: " + error : ""};
      if (count == -1) {
        reply.type = Reply::Type::nil;
        return {Status::complete, at, {}};
      }
      if (count < 0 || static_cast<std::uint64_t>(count) > limits.max_arguments)
        return fail("invalid array length " + std::to_string(count));
      if (depth <= 0) return fail("arrays nested too deeply");
      reply.type = Reply::Type::array;
      reply.elements.resize(static_cast<std::size_t>(count));
      for (auto& element : reply.elements) {
        auto parsed = parse_reply_at(input, at, limits, element, depth - 1);
        if (parsed.status != Status::complete) return parsed;
      }
      return {Status::complete, at, {}};
    }
    default:
      return fail("unexpected reply type '" + printable(input.substr(at, 1)) + "'");
  }
}

}  // namespace

Parsed parse_request(std::string_view input, const Limits& limits, std::vector<std::string_view>& arguments) {
  arguments.clear();
  if (input.empty()) return {Status::incomplete, 0, {}};
  Parsed parsed = input[0] == '*' ? parse_multibulk(input, limits, arguments) : parse_inline(input, limits, arguments);
  if (parsed.status != Status::complete) arguments.clear();
  return parsed;
}

Parsed parse_reply(std::string_view input, const Limits& limits, Reply& reply, int max_depth) {
  reply = Reply{};
  std::size_t at = 0;
  Parsed parsed = parse_reply_at(input, at, limits, reply, max_depth);
  if (parsed.status == Status::complete) parsed.consumed = at;
  return parsed;
}

void encode_command(std::string& out, std::span<const std::string_view> arguments) {
  append_array_header(out, arguments.size());
  for (const auto argument : arguments)
    append_bulk(out, argument);
}

std::string bulk_header(std::size_t length) { return "$" + std::to_string(length) + "\r\n"; }

void append_simple(std::string& out, std::string_view text) {
  out += '+';
  out += text;
  out += "\r\n";
}

void append_error(std::string& out, std::string_view text) {
  out += '-';
  for (const char c : text)
    out += (c == '\r' || c == '\n') ? ' ' : c;
  out += "\r\n";
}

void append_integer(std::string& out, std::int64_t value) {
  out += ':';
  out += std::to_string(value);
  out += "\r\n";
}

void append_bulk(std::string& out, std::string_view text) {
  out += bulk_header(text.size());
  out += text;
  out += "\r\n";
}

void append_nil(std::string& out) { out += "$-1\r\n"; }

void append_array_header(std::string& out, std::size_t count) {
  out += '*';
  out += std::to_string(count);
  out += "\r\n";
}

Value to_value(const Reply& reply) {
  Value value;
  value.type = reply.type;
  value.text = std::string(reply.text);
  value.integer = reply.integer;
  value.elements.reserve(reply.elements.size());
  for (const auto& element : reply.elements)
    value.elements.push_back(to_value(element));
  return value;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

}  // namespace dma::kv::resp
