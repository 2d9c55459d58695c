#include "configuration_toml_codec.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <optional>

namespace dma::detail::configuration_toml {
namespace {

using std::chrono::nanoseconds;
using namespace std::chrono_literals;

// TOML basic string with the escapes the format requires.
std::string toml_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += escape;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A unit suffix and how many of the base unit (nanoseconds, bytes) it stands for.
struct Unit {
  std::string_view suffix;
  std::int64_t factor;
};

constexpr std::array<Unit, 6> duration_units{{{"h", nanoseconds(1h).count()},
                                              {"min", nanoseconds(1min).count()},
                                              {"s", nanoseconds(1s).count()},
                                              {"ms", nanoseconds(1ms).count()},
                                              {"us", nanoseconds(1us).count()},
                                              {"ns", 1}}};

std::string duration_text(nanoseconds value) {
  for (const Unit& unit : duration_units) {
    if (value.count() != 0 && value.count() % unit.factor == 0) {
      return std::to_string(value.count() / unit.factor) + std::string(unit.suffix);
    }
  }
  return std::to_string(value.count()) + "ns";
}

// Byte sizes: an integer, or a string with a binary unit.
constexpr std::array<Unit, 5> byte_units{{{"TiB", std::int64_t{1} << 40},
                                          {"GiB", std::int64_t{1} << 30},
                                          {"MiB", std::int64_t{1} << 20},
                                          {"KiB", std::int64_t{1} << 10},
                                          {"B", 1}}};

std::string bytes_text(std::int64_t value) {
  for (const Unit& unit : byte_units) {
    if (value != 0 && value % unit.factor == 0 && unit.suffix != "B") {
      return toml_string(std::to_string(value / unit.factor) + std::string(unit.suffix));
    }
  }
  return std::to_string(value);
}

// "<digits><unit>" with one of `units`; empty on bad syntax or overflow.
template <std::size_t N>
std::optional<std::int64_t> parse_with_unit(std::string_view text, const std::array<Unit, N>& units) {
  std::int64_t number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc() || end == text.data() || text.front() == '-') return std::nullopt;
  const std::string_view suffix(end, static_cast<std::size_t>(text.data() + text.size() - end));
  for (const Unit& unit : units) {
    if (suffix != unit.suffix) continue;
    if (number > std::numeric_limits<std::int64_t>::max() / unit.factor) return std::nullopt;
    return number * unit.factor;
  }
  return std::nullopt;
}

template <typename Int>
Int read_integer(const Value& v) {
  const auto* integer = v.node.as_integer();
  if (!integer) v.expected("an integer");
  const std::int64_t value = integer->get();
  if (value < v.limits.min || value > v.limits.max) {
    v.refuse("expected an integer from " + std::to_string(v.limits.min) + " to " + std::to_string(v.limits.max) +
             ", got " + std::to_string(value));
  }
  return static_cast<Int>(value);
}

// The Rust crate's serde encoding of a Duration, so its files keep loading.
std::int64_t read_rust_duration(const Value& v, const toml::table& table) {
  std::int64_t secs = 0, nanos = 0;
  for (auto&& [name, node] : table) {
    const std::string key = v.key + "." + std::string(name.str());
    const Limits limits = name == "secs"
                              ? Limits{0, (std::numeric_limits<std::int64_t>::max() - 999'999'999) / 1'000'000'000}
                              : Limits{0, 999'999'999};
    if (name != "secs" && name != "nanos") {
      refuse(v.origin, name.source(), key, "unknown key; a duration table has only secs and nanos");
    }
    const Value field{node, key, limits, v.origin};
    (name == "secs" ? secs : nanos) = static_cast<std::int64_t>(Codec<std::size_t>::read(field));
  }
  return secs * 1'000'000'000 + nanos;
}

template <typename Enum, std::size_t N>
Enum read_enum(const Value& v, const std::array<Enum, N>& all) {
  std::string names;
  for (const Enum e : all)
    names += (names.empty() ? "" : ", ") + toml_string(to_string(e));
  const auto* text = v.node.as_string();
  if (!text) v.expected("one of " + names);
  if (const auto parsed = from_string<Enum>(text->get())) return *parsed;
  v.refuse("expected one of " + names + ", got " + toml_string(text->get()));
}

}  // namespace

void refuse(const Origin& origin, const toml::source_region& at, const std::string& key, const std::string& problem) {
  throw ConfigurationError(std::make_error_code(std::errc::invalid_argument), std::string(origin.name), at.begin.line,
                           at.begin.column, key, problem);
}

std::string_view type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time:
      return "a date or time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string toml_key(std::string_view name) {
  const bool bare = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
  return bare ? std::string(name) : toml_string(name);
}

bool Codec<bool>::read(const Value& v) {
  if (const auto* b = v.node.as_boolean()) return b->get();
  v.expected("true or false");
}

std::string Codec<bool>::write(bool value) { return value ? "true" : "false"; }

std::size_t Codec<std::size_t>::read(const Value& v) { return read_integer<std::size_t>(v); }

std::string Codec<std::size_t>::write(std::size_t value) { return std::to_string(value); }

std::uint16_t Codec<std::uint16_t>::read(const Value& v) { return read_integer<std::uint16_t>(v); }

std::string Codec<std::uint16_t>::write(std::uint16_t value) { return std::to_string(value); }

std::size_t Bytes::read(const Value& v) {
  std::int64_t value = 0;
  if (const auto* integer = v.node.as_integer()) {
    value = integer->get();
  } else if (const auto* text = v.node.as_string()) {
    const auto parsed = parse_with_unit(text->get(), byte_units);
    if (!parsed) {
      v.refuse("expected a size such as \"16GiB\" (an integer followed by B, KiB, MiB, GiB or TiB), got " +
               toml_string(text->get()));
    }
    value = *parsed;
  } else {
    v.expected("a byte count (an integer, or a string such as \"16GiB\")");
  }
  if (value < v.limits.min || value > v.limits.max) {
    v.refuse("expected a size from " + std::to_string(v.limits.min) + " to " + std::to_string(v.limits.max) +
             " bytes, got " + std::to_string(value));
  }
  return static_cast<std::size_t>(value);
}

std::string Bytes::write(std::size_t value) { return bytes_text(static_cast<std::int64_t>(value)); }

nanoseconds Codec<nanoseconds>::read(const Value& v) {
  std::optional<std::int64_t> count;
  if (const auto* text = v.node.as_string()) {
    count = parse_with_unit(text->get(), duration_units);
    if (!count) {
      v.refuse("expected a duration such as \"10ms\" (an integer followed by ns, us, ms, s, min or h), got " +
               toml_string(text->get()));
    }
  } else if (const auto* table = v.node.as_table()) {
    count = read_rust_duration(v, *table);
  } else {
    v.expected("a duration (a string such as \"10ms\")");
  }
  if (*count < v.limits.min || *count > v.limits.max) {
    v.refuse("expected a duration from " + duration_text(nanoseconds(v.limits.min)) + " to " +
             duration_text(nanoseconds(v.limits.max)) + ", got " + duration_text(nanoseconds(*count)));
  }
  return nanoseconds(*count);
}

std::string Codec<nanoseconds>::write(nanoseconds value) { return toml_string(duration_text(value)); }

Provider Codec<Provider>::read(const Value& v) {
  return read_enum(v, std::array{Provider::tcp, Provider::efa_direct, Provider::shm});
}

std::string Codec<Provider>::write(Provider value) { return toml_string(to_string(value)); }

WaitMode Codec<WaitMode>::read(const Value& v) {
  return read_enum(v, std::array{WaitMode::fd, WaitMode::adaptive, WaitMode::busy_poll});
}

std::string Codec<WaitMode>::write(WaitMode value) { return toml_string(to_string(value)); }

TcpProtocol Codec<TcpProtocol>::read(const Value& v) {
  return read_enum(v, std::array{TcpProtocol::automatic, TcpProtocol::native, TcpProtocol::rxm});
}

std::string Codec<TcpProtocol>::write(TcpProtocol value) { return toml_string(to_string(value)); }

std::string Codec<std::string>::read(const Value& v) {
  const auto* text = v.node.as_string();
  if (!text) v.expected("a string");
  const std::string& value = text->get();
  if (value.empty()) v.refuse("expected a non-empty string");
  if (value.find('\0') != std::string::npos) v.refuse("a NUL character is not allowed");
  return value;
}

std::string Codec<std::string>::write(const std::string& value) { return toml_string(value); }

}  // namespace dma::detail::configuration_toml
