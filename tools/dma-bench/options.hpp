// dma-bench's command line: every option, typed and validated, parsed in one place.
#pragma once

#include "types.hpp"

#include <dma/configuration.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace bench {

/// Run one side alone (--only), for profilers.
enum class Only { library, raw };

struct Options {
  /// --config: the file's [dma-libfabric] table (the defaults without one). The options below
  /// that set a configuration field (--bind, --wait, --spin-us, --target-wait) take the file's
  /// value unless given on the command line; both sides open their endpoints with the rest.
  dma::Configuration configuration;
  std::string config;  ///< the file's path, for the child target
  std::vector<std::size_t> sizes;
  std::vector<dma::Direction> directions;
  std::vector<int> depths;
  std::vector<Api> apis;
  std::vector<Wait> waits;
  std::vector<std::size_t> endpoints;  ///< --endpoints: the library service's, one point each
  int runs = 5;
  double duration = 0.2;  ///< seconds per run
  double spin_us = 50;
  bool inprocess_target = false;
  std::string bind = "127.0.0.1";
  Wait target_wait = Wait::fd;
  std::optional<Only> only;
  bool hugepages = false;
  bool json = false;
  int initiator_cpu = -1, target_cpu = -1;  ///< --pin I,T

  // The child target's own command line (internal).
  bool serve = false;
  std::size_t region = 0;
  int serve_cpu = -1;
};

/// The largest buffer a sweep may ask for on each side (largest size x deepest depth).
inline constexpr std::size_t max_span = std::size_t{8} << 30;

/// The options, or the exit code to return: 0 after --help or --version (printed), 2 after a bad
/// value (the message on stderr names the option).
std::variant<Options, int> parse_options(int argc, char** argv);

}  // namespace bench
