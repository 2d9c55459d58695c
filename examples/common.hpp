// The examples' shared command line, as in the Rust crate's `common` module, parsed with CLI11:
//   tcp:        <bind> [<address-hex> <rkey> <remote-addr>]
//   efa-direct: --efa [<address-hex> <rkey> <remote-addr>]
// Every example also takes --config FILE (a TOML file's [dma-libfabric] table, which the command
// line overrides), --log LEVEL (the library's messages on stderr), --help and --version.
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

/// One program's command line: the flags every example shares (--efa, --config, --log, --help,
/// --version), the positionals, and whatever flags the program adds before parse(). All option
/// parsing of an example happens here.
class CommandLine {
 public:
  CommandLine(std::string name, std::string description, std::string positionals_help)
      : app_(std::move(description), std::move(name)) {
    app_.set_version_flag("--version", app_.get_name() + " (dma-libfabric) " + std::string(dma::version()));
    app_.add_flag("--efa", efa_, "use efa-direct (the endpoint binds to the device: no <bind>)");
    app_.add_option("--config", config_,
                    "TOML file whose [dma-libfabric] table configures the endpoint; --efa and <bind> override it");
    app_.add_option("--log", log_, "print the library's messages at or above this level on stderr")
        ->check(CLI::IsMember({"debug", "info", "warning", "error"}));
    app_.add_option("arguments", positionals_, std::move(positionals_help));
    app_.footer("tcp:        " + app_.get_name() + " <bind> [<address-hex> <rkey> <remote-addr>]\n" +
                "efa-direct: " + app_.get_name() + " --efa [<address-hex> <rkey> <remote-addr>]\n" +
                "With --config FILE whose table sets bind (or an efa-direct provider), <bind> may be left out.");
  }

  CLI::App& app() { return app_; }

  /// Parses argv and loads --config; returns the exit code when the program should stop here: 0
  /// after --help or --version, 2 after a bad option (CLI11's message names it) or a configuration
  /// file the library refused (the message names the file, line and key).
  std::optional<int> parse(int argc, char** argv) {
    try {
      app_.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
      return app_.exit(error) == 0 ? 0 : 2;
    }
    if (!config_.empty()) {
      try {
        file_ = dma::Configuration::from_toml(config_);
      } catch (const dma::ConfigurationError& error) {
        std::fprintf(stderr, "%s: --config: %s\n", app_.get_name().c_str(), error.what());
        return 2;
      }
    }
    if (!log_.empty()) {
      for (const auto level : {dma::LogLevel::debug, dma::LogLevel::info, dma::LogLevel::warning, dma::LogLevel::error})
        if (dma::to_string(level) == log_) dma::set_log_handler(dma::log_to_stderr(level));
    }
    return std::nullopt;
  }

  bool efa() const { return efa_; }
  const std::vector<std::string>& positionals() const { return positionals_; }

  /// --config's configuration (the defaults without it), with --efa applied: efa-direct, no bind.
  dma::Configuration configuration() const {
    dma::Configuration configuration = file_;
    if (efa_) {
      configuration.providers = {dma::Provider::efa_direct};
      configuration.bind.reset();
    }
    return configuration;
  }

  /// Whether the endpoint is efa-direct's (--efa, or the file's provider), which binds to the
  /// device and takes no <bind>.
  bool uses_efa() const {
    const auto configuration = this->configuration();
    return !configuration.providers.empty() && configuration.providers.front() == dma::Provider::efa_direct;
  }

  /// The seed's parse(): with efa-direct, no bind; otherwise tcp and the first positional is the
  /// bind address, which overrides the file's (when the file sets one and exactly three
  /// positionals are given, they are the advertisement). Exactly three positionals after that
  /// are the peer's advertisement; any other count gives no peer (the example then prompts).
  Arguments initiator() const {
    Arguments arguments;
    arguments.configuration = configuration();
    std::size_t next = 0;
    const bool bind_in_file = arguments.configuration.bind.has_value();
    if (!uses_efa() && !positionals_.empty() && !(bind_in_file && positionals_.size() == 3)) {
      arguments.configuration.bind = positionals_[next++];
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
  std::string config_;
  std::string log_;
  dma::Configuration file_;
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
