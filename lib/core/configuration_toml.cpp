// Configuration from and to TOML (toml++). The table `keys` below is the one place that lists
// which field has which key, type and range: a new Configuration field needs one line there (and
// one in docs/configuration.md, which a unit test checks).
#include "dma/configuration.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <limits>
#include <memory>
#include <type_traits>

namespace dma {
namespace {

using std::chrono::nanoseconds;
using namespace std::chrono_literals;

// Where the values being read come from, for error messages.
struct Origin {
  std::string_view name;    // file name or caller-given origin
  std::string_view prefix;  // "dma-libfabric." or "" for the root table
};

[[noreturn]] void refuse(const Origin& origin, const toml::source_region& at, const std::string& key,
                         const std::string& problem) {
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

// A bare TOML key when the name allows one, a quoted key otherwise.
std::string toml_key(std::string_view name) {
  const bool bare = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
  return bare ? std::string(name) : toml_string(name);
}

std::vector<std::string_view> split_section(std::string_view section) {
  std::vector<std::string_view> parts;
  while (!section.empty()) {
    const auto dot = section.find('.');
    parts.push_back(section.substr(0, dot));
    if (dot == std::string_view::npos) break;
    section.remove_prefix(dot + 1);
  }
  return parts;
}

// The allowed range of an integer (in its unit) or a duration (in nanoseconds), both inclusive.
struct Limits {
  std::int64_t min = 0;
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
};

constexpr Limits between(nanoseconds min, nanoseconds max) { return {min.count(), max.count()}; }

// A value being read: its node, its full key for messages, its limits.
struct Value {
  const toml::node& node;
  const std::string& key;
  const Limits& limits;
  const Origin& origin;

  [[noreturn]] void refuse(const std::string& problem) const { dma::refuse(origin, node.source(), key, problem); }
  [[noreturn]] void expected(std::string_view what) const {
    refuse("expected " + std::string(what) + ", got " + std::string(type_name(node)));
  }
};

// A unit suffix and how many of the base unit (nanoseconds, bytes) it stands for.
struct Unit {
  std::string_view suffix;
  std::int64_t factor;
};

// Durations: a string of an integer and a unit, or the Rust crate's { secs = N, nanos = N }.
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

template <typename T>
struct Codec;

template <>
struct Codec<bool> {
  static bool read(const Value& v) {
    if (const auto* b = v.node.as_boolean()) return b->get();
    v.expected("true or false");
  }
  static std::string write(bool value) { return value ? "true" : "false"; }
};

// An integer within the key's limits (which also keep it inside Int's range).
template <typename Int>
struct IntegerCodec {
  static Int read(const Value& v) {
    const auto* integer = v.node.as_integer();
    if (!integer) v.expected("an integer");
    const std::int64_t value = integer->get();
    if (value < v.limits.min || value > v.limits.max) {
      v.refuse("expected an integer from " + std::to_string(v.limits.min) + " to " + std::to_string(v.limits.max) +
               ", got " + std::to_string(value));
    }
    return static_cast<Int>(value);
  }
  static std::string write(Int value) { return std::to_string(value); }
};

template <>
struct Codec<std::size_t> : IntegerCodec<std::size_t> {};

template <>
struct Codec<std::uint16_t> : IntegerCodec<std::uint16_t> {};

// A byte count: an integer or a string such as "16GiB".
struct Bytes {
  static std::size_t read(const Value& v) {
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
  static std::string write(std::size_t value) { return bytes_text(static_cast<std::int64_t>(value)); }
};

template <>
struct Codec<nanoseconds> {
  static nanoseconds read(const Value& v) {
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
  static std::string write(nanoseconds value) { return toml_string(duration_text(value)); }

  // The Rust crate's serde encoding of a Duration, so its files keep loading.
  static std::int64_t read_rust_duration(const Value& v, const toml::table& table) {
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
};

template <typename Enum, std::size_t N>
struct EnumCodec {
  static Enum read(const Value& v, const std::array<Enum, N>& all) {
    std::string names;
    for (const Enum e : all)
      names += (names.empty() ? "" : ", ") + toml_string(to_string(e));
    const auto* text = v.node.as_string();
    if (!text) v.expected("one of " + names);
    if (const auto parsed = from_string<Enum>(text->get())) return *parsed;
    v.refuse("expected one of " + names + ", got " + toml_string(text->get()));
  }
  static std::string write(Enum value) { return toml_string(to_string(value)); }
};

template <>
struct Codec<Provider> : EnumCodec<Provider, 3> {
  static Provider read(const Value& v) {
    return EnumCodec::read(v, {Provider::tcp, Provider::efa_direct, Provider::shm});
  }
};

template <>
struct Codec<WaitMode> : EnumCodec<WaitMode, 3> {
  static WaitMode read(const Value& v) {
    return EnumCodec::read(v, {WaitMode::fd, WaitMode::adaptive, WaitMode::busy_poll});
  }
};

template <>
struct Codec<TcpProtocol> : EnumCodec<TcpProtocol, 3> {
  static TcpProtocol read(const Value& v) {
    return EnumCodec::read(v, {TcpProtocol::automatic, TcpProtocol::native, TcpProtocol::rxm});
  }
};

// Strings end up in fi_getinfo and domain names: non-empty, no NUL.
template <>
struct Codec<std::string> {
  static std::string read(const Value& v) {
    const auto* text = v.node.as_string();
    if (!text) v.expected("a string");
    const std::string& value = text->get();
    if (value.empty()) v.refuse("expected a non-empty string");
    if (value.find('\0') != std::string::npos) v.refuse("a NUL character is not allowed");
    return value;
  }
  static std::string write(const std::string& value) { return toml_string(value); }
};

template <typename T>
struct Codec<std::vector<T>> {
  static std::vector<T> read(const Value& v) {
    const auto* array = v.node.as_array();
    if (!array) v.expected("an array");
    std::vector<T> values;
    for (std::size_t i = 0; i < array->size(); ++i) {
      const std::string key = v.key + "[" + std::to_string(i) + "]";
      values.push_back(Codec<T>::read(Value{*array->get(i), key, v.limits, v.origin}));
    }
    return values;
  }
  static std::string write(const std::vector<T>& values) {
    std::string out = "[";
    for (const T& value : values)
      out += (out.size() > 1 ? ", " : "") + Codec<T>::write(value);
    return out + "]";
  }
};

template <typename Codec, typename T>
std::string write_optional(const std::string& name, const std::optional<T>& value) {
  return value ? name + " = " + Codec::write(*value) + "\n" : "# " + name + ": not set\n";
}

template <typename Codec, typename T>
std::string write_value(const std::string& name, const T& value) {
  return name + " = " + Codec::write(value) + "\n";
}

struct Key {
  std::string_view name;
  Limits limits;
  void (*read)(const Value& value, Configuration& configuration);
  std::string (*write)(const Key& key, const Configuration& configuration);
};

template <typename M>
struct member_type;
template <typename M>
struct member_type<M Configuration::*> {
  using type = M;
};

template <typename T>
struct plain_codec {
  using type = Codec<T>;
};
template <typename T>
struct plain_codec<std::optional<T>> {
  using type = Codec<T>;
};

// One key of one field; an optional's codec is its value type's (an absent key leaves it empty:
// TOML has no null). The codec is chosen by the field's type unless given (e.g. Bytes).
template <auto Member, typename Inner = void>
Key key(std::string_view name, Limits limits = {}) {
  using Field = typename member_type<decltype(Member)>::type;
  using Use = std::conditional_t<std::is_void_v<Inner>, typename plain_codec<Field>::type, Inner>;
  return Key{name, limits,
             [](const Value& value, Configuration& configuration) { configuration.*Member = Use::read(value); },
             [](const Key& self, const Configuration& configuration) {
               const std::string name = toml_key(self.name);
               if constexpr (requires { (configuration.*Member).has_value(); }) {
                 return write_optional<Use>(name, configuration.*Member);
               } else {
                 return write_value<Use>(name, configuration.*Member);
               }
             }};
}

constexpr std::int64_t mebi = std::int64_t{1} << 20;

// Every field of Configuration, once. Its order is to_toml()'s.
const std::array keys{
    key<&Configuration::providers>("providers"),
    key<&Configuration::interfaces>("interfaces"),
    key<&Configuration::bind>("bind"),
    key<&Configuration::port>("port", {1, 65535}),
    key<&Configuration::tcp_protocol>("tcp_protocol"),
    key<&Configuration::max_in_flight>("max_in_flight", {1, mebi}),
    key<&Configuration::crc_pool_threads>("crc_pool_threads", {1, 1024}),
    key<&Configuration::progress_deadline>("progress_deadline", between(1us, 24h)),
    key<&Configuration::transfer_deadline>("transfer_deadline", between(1us, 24h)),
    key<&Configuration::unreachable_backoff>("unreachable_backoff", between(0s, 24h)),
    key<&Configuration::unreachable_backoff_max>("unreachable_backoff_max", between(0s, 24h)),
    key<&Configuration::cq_size>("cq_size", {0, 16 * mebi}),
    key<&Configuration::wait_mode>("wait_mode"),
    key<&Configuration::spin_budget>("spin_budget", between(0s, 1s)),
    key<&Configuration::backstop_interval>("backstop_interval", between(1us, 1min)),
    key<&Configuration::cq_batch>("cq_batch", {1, 1024}),
    key<&Configuration::notification_queue>("notification_queue", {1, mebi}),
    key<&Configuration::max_segment_bytes, Bytes>("max_segment_bytes", {0, std::numeric_limits<std::int64_t>::max()}),
    key<&Configuration::segment_window>("segment_window", {1, 16}),
    key<&Configuration::efa_rnr_retry>("efa_rnr_retry", {0, 7}),
    key<&Configuration::endpoints>("endpoints", {1, 16}),
    key<&Configuration::stripe_threshold, Bytes>("stripe_threshold", {1, std::numeric_limits<std::int64_t>::max()}),
    key<&Configuration::force_local_registration>("force_local_registration"),
    key<&Configuration::registration_cache_entries>("registration_cache_entries", {0, 1024 * mebi}),
    key<&Configuration::registration_cache_bytes, Bytes>("registration_cache_bytes",
                                                         {0, std::numeric_limits<std::int64_t>::max()}),
};

const std::array<std::string_view, keys.size()> key_names = [] {
  std::array<std::string_view, keys.size()> names;
  std::transform(keys.begin(), keys.end(), names.begin(), [](const Key& k) { return k.name; });
  return names;
}();

std::string known_keys() {
  std::string text;
  for (const Key& k : keys)
    text += (text.empty() ? "" : ", ") + std::string(k.name);
  return text;
}

const toml::table& find_section(const toml::table& root, std::string_view section, const Origin& origin) {
  const toml::table* table = &root;
  std::string path;
  for (const std::string_view part : split_section(section)) {
    path += (path.empty() ? "" : ".") + std::string(part);
    const toml::node* node = table->get(part);
    if (!node) {
      throw ConfigurationError(std::make_error_code(std::errc::invalid_argument), std::string(origin.name), 0, 0, path,
                               "no [" + path + "] table");
    }
    table = node->as_table();
    if (!table) refuse(origin, node->source(), path, "expected a table, got " + std::string(type_name(*node)));
  }
  return *table;
}

Configuration read(const toml::table& root, std::string_view section, std::string_view origin_name) {
  const std::string prefix = section.empty() ? "" : std::string(section) + ".";
  const Origin origin{origin_name, prefix};
  Configuration configuration;
  for (auto&& [name, node] : find_section(root, section, origin)) {
    const std::string full = prefix + std::string(name.str());
    const std::string_view wanted = name.str();  // clang 14 cannot capture a structured binding
    const auto entry = std::find_if(keys.begin(), keys.end(), [&](const Key& k) { return k.name == wanted; });
    if (entry == keys.end()) refuse(origin, name.source(), full, "unknown key; the keys are " + known_keys());
    entry->read(Value{node, full, entry->limits, origin}, configuration);
  }
  return configuration;
}

std::string read_file(const std::filesystem::path& path) {
  const auto fail = [&](int error) {
    throw ConfigurationError(std::error_code(error, std::generic_category()), path.string(), 0, 0, "",
                             "cannot read: " + std::generic_category().message(error));
  };
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) fail(errno);
  std::string text;
  char buffer[8192];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0)
    text.append(buffer, n);
  if (std::ferror(file.get())) fail(errno != 0 ? errno : EIO);
  return text;
}

template <typename Load>
Configuration reporting(std::error_code& ec, std::string& message, Load&& load) {
  try {
    Configuration configuration = load();
    ec.clear();
    message.clear();
    return configuration;
  } catch (const ConfigurationError& error) {
    ec = error.code();
    message = error.what();
  }
  return Configuration{};
}

std::string position_text(const std::string& origin, std::uint32_t line, std::uint32_t column, const std::string& key,
                          const std::string& problem) {
  std::string text = origin;
  if (line != 0) text += ":" + std::to_string(line) + ":" + std::to_string(column);
  text += ": ";
  if (!key.empty()) text += key + ": ";
  return text + problem;
}

}  // namespace

ConfigurationError::ConfigurationError(std::error_code code, std::string origin, std::uint32_t line,
                                       std::uint32_t column, std::string key, const std::string& problem)
    : std::system_error(code),
      origin_(std::move(origin)),
      line_(line),
      column_(column),
      key_(std::move(key)),
      what_(position_text(origin_, line_, column_, key_, problem)) {}

Configuration Configuration::from_toml_string(std::string_view text, std::string_view section,
                                              std::string_view origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& error) {
    const auto& at = error.source().begin;
    throw ConfigurationError(std::make_error_code(std::errc::invalid_argument), std::string(origin), at.line, at.column,
                             "", "not valid TOML: " + std::string(error.description()));
  }
  return read(root, section, origin);
}

Configuration Configuration::from_toml_string(std::string_view text, std::string_view section, std::string_view origin,
                                              std::error_code& ec, std::string& message) {
  return reporting(ec, message, [&] { return from_toml_string(text, section, origin); });
}

Configuration Configuration::from_toml(const std::filesystem::path& path, std::string_view section) {
  return from_toml_string(read_file(path), section, path.string());
}

Configuration Configuration::from_toml(const std::filesystem::path& path, std::string_view section, std::error_code& ec,
                                       std::string& message) {
  return reporting(ec, message, [&] { return from_toml(path, section); });
}

std::string Configuration::to_toml(std::string_view section) const {
  std::string text;
  if (!section.empty()) {
    std::string header;
    for (const std::string_view part : split_section(section))
      header += (header.empty() ? "" : ".") + toml_key(part);
    text = "[" + header + "]\n";
  }
  for (const Key& k : keys)
    text += k.write(k, *this);
  return text;
}

std::span<const std::string_view> Configuration::toml_keys() noexcept { return key_names; }

}  // namespace dma
