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
    return std::string(key) + " takes yes or no, not '" + std::string(value) + "'";
  }
  return {};
}

std::string parse_number(std::string_view key, std::string_view value, std::uint64_t low, std::uint64_t& number) {
  const auto parsed = dma::kv::parse_number(value);
  if (!parsed || *parsed < low) {
    return std::string(key) + " takes a whole number of at least " + std::to_string(low) + ", not '" +
           std::string(value) + "'";
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
    if (key == "config") {
      options.config = value;
    } else if (key == "bind") {
      options.bind = value;
      options.bind_given = true;
    } else if (key == "efa") {
      why = parse_flag(key, value, options.efa);
    } else if (key == "hold-values") {
      why = parse_flag(key, value, options.hold_values);
    } else if (key == "allow-any-fabric-host") {
      why = parse_flag(key, value, options.allow_any_fabric_host);
    } else if (key == "max-value") {
      if (why = parse_number(key, value, 1, number); why.empty()) options.max_value = number;
    } else if (key == "pool-threads") {
      if (why = parse_number(key, value, 0, number); why.empty()) options.pool_threads = number;
    } else if (key == "transfer-deadline-ms") {
      if (why = parse_number(key, value, 0, number); why.empty()) options.transfer_deadline_ms = number;
    } else if (key == "get-copy-limit") {
      if (why = parse_number(key, value, 1, number); why.empty()) options.get_copy_limit = number;
    } else if (key == "get-copy-client-limit") {
      if (why = parse_number(key, value, 1, number); why.empty()) options.get_copy_client_limit = number;
    } else if (key == "max-hello-bindings") {
      if (why = parse_number(key, value, 1, number); why.empty()) options.max_hello_bindings = number;
    } else if (key == "hello-idle-seconds") {
      if (why = parse_number(key, value, 1, number); why.empty()) options.hello_idle_seconds = number;
    } else if (key == "confirm-gets") {
      if (!dma::kv::parse_confirmation_setting(value, options.confirm_gets)) {
        why = "confirm-gets takes auto, reply or notification, not '" + std::string(value) + "'";
      }
    } else {
      why = "unknown argument '" + std::string(key) +
            "' (config, bind, efa, max-value, allow-any-fabric-host, pool-threads, transfer-deadline-ms, "
            "hold-values, confirm-gets, get-copy-limit, get-copy-client-limit, max-hello-bindings, "
            "hello-idle-seconds)";
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
