// The examples' shared argument handling, as in the Rust crate's `common` module:
//   tcp:        <bind> [<address-hex> <rkey> <remote-addr>]
//   efa-direct: --efa [<address-hex> <rkey> <remote-addr>]
#pragma once

#include <dma/dma.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace examples {

struct Arguments {
  dma::Configuration configuration;
  std::optional<dma::Advertisement> peer;
  std::vector<std::string> flags;
  bool has_flag(std::string_view flag) const {
    for (const auto& f : flags) {
      if (f == flag) return true;
    }
    return false;
  }
};

/// Thrown for the errors the Rust examples return from main (printed as `error: ...`, exit 1).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Splits the command line into flags (starting with `--`, kept in arguments) and positionals.
inline std::vector<std::string_view> split_arguments(int argc, char** argv, Arguments& arguments) {
  std::vector<std::string_view> positionals;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.starts_with("--")) {
      arguments.flags.emplace_back(arg);
    } else {
      positionals.push_back(arg);
    }
  }
  return positionals;
}

inline Arguments parse(int argc, char** argv) {
  Arguments arguments;
  const auto positionals = split_arguments(argc, argv, arguments);
  std::size_t next = 0;
  if (arguments.has_flag("--efa")) {
    arguments.configuration.providers = {dma::Provider::efa_direct};
  } else {
    arguments.configuration.providers = {dma::Provider::tcp};
    if (next < positionals.size()) arguments.configuration.bind = std::string(positionals[next++]);
  }
  if (positionals.size() - next == 3) {
    std::error_code ec;
    arguments.peer = dma::Advertisement::from_fields(std::span(positionals).subspan(next), ec);
    if (ec) throw Failure("fabric error: " + ec.message());
  }
  return arguments;
}

/// Reads one line `<address-hex> <rkey> <remote-addr>` from stdin (the efa-direct start order).
inline dma::Advertisement peer_from_stdin() {
  std::string line;
  if (!std::getline(std::cin, line)) throw Failure("fabric error: reading the advertisement: end of input");
  std::vector<std::string_view> fields;
  std::size_t at = 0;
  while (at < line.size()) {
    const auto start = line.find_first_not_of(" \t\r", at);
    if (start == std::string::npos) break;
    const auto stop = std::min(line.find_first_of(" \t\r", start), line.size());
    fields.emplace_back(line.data() + start, stop - start);
    at = stop;
  }
  if (fields.size() != 3) {
    throw Failure("fabric error: expected <address-hex> <rkey> <remote-addr>, got " + std::to_string(fields.size()) +
                  " fields");
  }
  std::error_code ec;
  auto advertisement = dma::Advertisement::from_fields(fields, ec);
  if (ec) throw Failure("fabric error: " + ec.message());
  return advertisement;
}

/// The peer from the command line, or pasted on stdin after the prompt.
inline dma::Advertisement peer_or_prompt(const Arguments& arguments) {
  if (arguments.peer) return *arguments.peer;
  std::printf("paste the target's <address-hex> <rkey> <remote-addr>:\n");
  std::fflush(stdout);
  return peer_from_stdin();
}

/// Rust's `{:?}` of an Option<u32>: `Some(1234567)` or `None`.
inline std::string debug_option(const std::optional<std::uint32_t>& value) {
  return value ? "Some(" + std::to_string(*value) + ")" : "None";
}

/// Runs body, printing `error: ...` and returning 1 the way a Rust main returning Err does.
template <typename Body>
int run_main(Body&& body) {
  try {
    return body();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}

}  // namespace examples
