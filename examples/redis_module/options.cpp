#include "options.hpp"

#include <dma/kv/protocol.hpp>

#include <chrono>

namespace dma_module {

namespace {

std::string parse_flag(std::string_view key, std::string_view value, bool& flag) {
  if (value == "yes") {
    flag = true;
  } else if (value == "no") {
    flag = false;
  } else {
    return std::string(key) + " takes yes or no, not " + dma::kv::quote(value);
  }
  return {};
}

std::string parse_number(std::string_view key, std::string_view value, std::uint64_t low, std::uint64_t& number) {
  const auto parsed = dma::kv::parse_number(value);
  if (!parsed || *parsed < low) {
    return std::string(key) + " takes a whole number of at least " + std::to_string(low) + ", not " +
           dma::kv::quote(value);
  }
  number = *parsed;
  return {};
}

}  // namespace

std::string parse_options(std::span<const std::string_view> arguments, Options& options) {
  if (arguments.size() % 2 != 0) {
    return "arguments come in pairs (key value); '" + std::string(arguments.back()) + "' has no value";
  }
  for (std::size_t i = 0; i < arguments.size(); i += 2) {
    const std::string_view key = arguments[i];
    const std::string_view value = arguments[i + 1];
    std::uint64_t number = 0;
    std::string why;
    if (auto protocol = dma::kv::apply_setting(options, key, value)) {
      why = std::move(*protocol);
    } else if (key == "config") {
      options.config = value;
    } else if (key == "bind") {
      options.bind = value;
      options.bind_given = true;
    } else if (key == "efa") {
      why = parse_flag(key, value, options.efa);
    } else if (key == "hold-values") {
      why = parse_flag(key, value, options.hold_values);
    } else if (key == "pool-threads") {
      if (why = parse_number(key, value, 0, number); why.empty()) options.pool_threads = number;
    } else if (key == "get-copy-limit") {
      if (why = parse_number(key, value, 1, number); why.empty()) options.get_copy_limit = number;
    } else if (key == "get-copy-client-limit") {
      if (why = parse_number(key, value, 1, number); why.empty()) options.get_copy_client_limit = number;
    } else if (key == "get-copy-cache") {
      if (why = parse_number(key, value, 0, number); why.empty()) options.get_copy_cache = number;
    } else {
      why = "unknown argument " + dma::kv::quote(key) +
            " (config, bind, efa, pool-threads, hold-values, get-copy-limit, get-copy-client-limit, get-copy-cache";
      for (const auto& setting : dma::kv::settings) {
        why += ", ";
        why += setting.name;
      }
      why += ")";
    }
    if (!why.empty()) return why;
  }
  return {};
}

dma::Configuration Options::configuration() const {
  dma::Configuration configuration;
  if (!config.empty()) configuration = dma::Configuration::from_toml(config);
  if (efa) {
    configuration.providers = {dma::Provider::efa_direct};
    configuration.bind.reset();
  } else if (configuration.providers.empty() || configuration.providers.front() == dma::Provider::tcp) {
    configuration.providers = {dma::Provider::tcp};
    if (bind_given || !configuration.bind) configuration.bind = bind;
  }
  if (transfer_deadline_ms != 0) configuration.transfer_deadline = std::chrono::milliseconds(transfer_deadline_ms);
  return configuration;
}

}  // namespace dma_module
