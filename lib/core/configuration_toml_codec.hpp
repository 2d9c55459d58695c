// How each type of a Configuration field reads from and writes to TOML, with the error messages
// that name the file, position and key. configuration_toml.cpp maps the fields to keys.
#pragma once

#include "dma/configuration.hpp"

#include <toml++/toml.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace dma::detail::configuration_toml {

// Where the values being read come from, for error messages.
struct Origin {
  std::string_view name;    // file name or caller-given origin
  std::string_view prefix;  // "dma-libfabric." or "" for the root table
};

[[noreturn]] void refuse(const Origin& origin, const toml::source_region& at, const std::string& key,
                         const std::string& problem);

std::string_view type_name(const toml::node& node);

// A bare TOML key when the name allows one, a quoted key otherwise.
std::string toml_key(std::string_view name);

// The allowed range of an integer (in its unit) or a duration (in nanoseconds), both inclusive.
struct Limits {
  std::int64_t min = 0;
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
};

constexpr Limits between(std::chrono::nanoseconds min, std::chrono::nanoseconds max) {
  return {min.count(), max.count()};
}

// A value being read: its node, its full key for messages, its limits.
struct Value {
  const toml::node& node;
  const std::string& key;
  const Limits& limits;
  const Origin& origin;

  [[noreturn]] void refuse(const std::string& problem) const {
    configuration_toml::refuse(origin, node.source(), key, problem);
  }
  [[noreturn]] void expected(std::string_view what) const {
    refuse("expected " + std::string(what) + ", got " + std::string(type_name(node)));
  }
};

// Codec<T>::read(value) returns the field's value or throws ConfigurationError;
// Codec<T>::write(value) returns its TOML text.
template <typename T>
struct Codec;

template <>
struct Codec<bool> {
  static bool read(const Value& v);
  static std::string write(bool value);
};

// Integers within the key's limits (which also keep them inside the type's range).
template <>
struct Codec<std::size_t> {
  static std::size_t read(const Value& v);
  static std::string write(std::size_t value);
};

template <>
struct Codec<std::uint16_t> {
  static std::uint16_t read(const Value& v);
  static std::string write(std::uint16_t value);
};

// A byte count: an integer or a string such as "16GiB".
struct Bytes {
  static std::size_t read(const Value& v);
  static std::string write(std::size_t value);
};

// Durations: a string of an integer and a unit, or the Rust crate's { secs = N, nanos = N }.
template <>
struct Codec<std::chrono::nanoseconds> {
  static std::chrono::nanoseconds read(const Value& v);
  static std::string write(std::chrono::nanoseconds value);
};

// The enumerations: one of the names to_string() prints.
template <>
struct Codec<Provider> {
  static Provider read(const Value& v);
  static std::string write(Provider value);
};

template <>
struct Codec<WaitMode> {
  static WaitMode read(const Value& v);
  static std::string write(WaitMode value);
};

template <>
struct Codec<TcpProtocol> {
  static TcpProtocol read(const Value& v);
  static std::string write(TcpProtocol value);
};

// Strings end up in fi_getinfo and domain names: non-empty, no NUL.
template <>
struct Codec<std::string> {
  static std::string read(const Value& v);
  static std::string write(const std::string& value);
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

}  // namespace dma::detail::configuration_toml
