// The examples' shared command line, as in the Rust crate's `common` module, parsed with CLI11:
//   tcp:        <bind> [<address-hex> <rkey> <remote-addr>]
//   efa-direct: --efa [<address-hex> <rkey> <remote-addr>]
// Every example also answers --help and --version.
#pragma once

#include <dma/dma.hpp>
#include <dma/version.hpp>

#include <CLI/CLI.hpp>

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
};

/// Thrown for the errors the Rust examples return from main (printed as `error: ...`, exit 1).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One program's command line: the flags every example shares (--efa, --help, --version), the
/// positionals, and whatever flags the program adds before parse(). All option parsing of an
/// example happens here.
class CommandLine {
 public:
  CommandLine(std::string name, std::string description, std::string positionals_help)
      : app_(std::move(description), std::move(name)) {
    app_.set_version_flag("--version", app_.get_name() + " (dma-libfabric) " + std::string(dma::version()));
    app_.add_flag("--efa", efa_, "use efa-direct (the endpoint binds to the device: no <bind>)");
    app_.add_option("arguments", positionals_, std::move(positionals_help));
    app_.footer("tcp:        " + app_.get_name() + " <bind> [<address-hex> <rkey> <remote-addr>]\n" +
                "efa-direct: " + app_.get_name() + " --efa [<address-hex> <rkey> <remote-addr>]");
  }

  CLI::App& app() { return app_; }

  /// Parses argv; returns the exit code when the program should stop here: 0 after --help or
  /// --version, 2 after a bad option (CLI11's message names it).
  std::optional<int> parse(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
      return app_.exit(error) == 0 ? 0 : 2;
    }
    return std::nullopt;
  }

  bool efa() const { return efa_; }
  const std::vector<std::string>& positionals() const { return positionals_; }

  /// The seed's parse(): with --efa, efa-direct and no bind; otherwise tcp and the first positional
  /// is the bind address. Exactly three positionals after that are the peer's advertisement; any
  /// other count gives no peer (the example then prompts for it).
  Arguments initiator() const {
    Arguments arguments;
    std::size_t next = 0;
    if (efa_) {
      arguments.configuration.providers = {dma::Provider::efa_direct};
    } else {
      arguments.configuration.providers = {dma::Provider::tcp};
      if (next < positionals_.size()) arguments.configuration.bind = positionals_[next++];
    }
    if (positionals_.size() - next == 3) {
      const std::vector<std::string_view> fields(positionals_.begin() + static_cast<std::ptrdiff_t>(next),
                                                 positionals_.end());
      std::error_code ec;
      arguments.peer = dma::Advertisement::from_fields(fields, ec);
      if (ec) throw Failure("fabric error: " + ec.message());
    }
    return arguments;
  }

 private:
  CLI::App app_;
  bool efa_ = false;
  std::vector<std::string> positionals_;
};

/// Reads one line `<address-hex> <rkey> <remote-addr>` from stdin (the efa-direct start order).
inline dma::Advertisement peer_from_stdin() {
  std::string line;
  if (!std::getline(std::cin, line)) throw Failure("fabric error: reading the advertisement: end of input");
  try {
    return dma::Advertisement::parse(line);
  } catch (const std::system_error& error) {
    throw Failure(std::string("fabric error: ") + error.what());
  }
}

/// The peer from the command line, or pasted on stdin after the prompt.
inline dma::Advertisement peer_or_prompt(const Arguments& arguments) {
  if (arguments.peer) return *arguments.peer;
  std::printf("paste the target's <address-hex> <rkey> <remote-addr>:\n");
  std::fflush(stdout);
  return peer_from_stdin();
}

/// A CRC-32C as every example prints it, initiator and target alike: Rust's `{:?}` of an
/// Option<u32>, `Some(2486649235)` (decimal) or `None`.
inline std::string crc_text(const std::optional<std::uint32_t>& value) {
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
