// Configuration from and to TOML (toml++). The table `keys` below is the one place that lists
// which field has which key, type and range: a new Configuration field needs one line there (and
// one in docs/configuration.md, which a unit test checks). configuration_toml_codec.cpp reads and
// writes each type of value.
#include "dma/configuration.hpp"

#include "configuration_toml_codec.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <memory>
#include <type_traits>

namespace dma {
namespace {

using namespace detail::configuration_toml;
using namespace std::chrono_literals;

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
