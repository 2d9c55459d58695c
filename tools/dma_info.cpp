// dma-info: what dma-libfabric can open on this machine. For each provider the library supports
// (or the one named by --provider) it asks libfabric with the library's own hints, opens each
// fabric and domain found, and reports their attributes in libfabric's names (fi_tostr_r), as a
// table or --json, with what the library itself will use there (wait object, what a completion
// guarantees, segment size, in-flight limit, receives for immediate data). With --config it asks what that
// configuration would open: the file's provider, bind address and interfaces, unless --provider or --bind say
// otherwise. Exit 0: something usable was found; 2: nothing (the message says what was tried) or a bad option or
// configuration file.
#include <dma/dma.hpp>
#include <dma/version.hpp>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

/// libfabric's names for a value of one of its types: "FI_MSG, FI_RMA" becomes {"FI_MSG", "FI_RMA"}.
std::vector<std::string> names_of(const void* value, fi_type type) {
  char buffer[2048] = {};
  const char* text = fi_tostr_r(buffer, sizeof buffer, value, type);
  std::vector<std::string> names;
  std::string current;
  for (const char* c = text != nullptr ? text : "";; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!current.empty()) names.push_back(current);
      current.clear();
      if (*c == '\0') break;
    } else if (*c != ' ' && *c != '\n') {
      current += *c;
    }
  }
  return names;
}

std::string name_of(const void* value, fi_type type) {
  const auto names = names_of(value, type);
  return names.empty() ? "" : names.front();
}

/// The wait objects a CQ is tried with; fi_tostr has no type for them in libfabric 1.17.
constexpr std::pair<fi_wait_obj, const char*> wait_objects[] = {
    {FI_WAIT_NONE, "FI_WAIT_NONE"},   {FI_WAIT_UNSPEC, "FI_WAIT_UNSPEC"},
    {FI_WAIT_FD, "FI_WAIT_FD"},       {FI_WAIT_MUTEX_COND, "FI_WAIT_MUTEX_COND"},
    {FI_WAIT_YIELD, "FI_WAIT_YIELD"}, {FI_WAIT_POLLFD, "FI_WAIT_POLLFD"},
};

/// What the library itself will use on an entry: an Endpoint opened with its configuration.
struct Uses {
  std::string wait_object;         // FI_WAIT_FD, or FI_WAIT_NONE where progress polls
  std::string delivery, transmit;  // what a completed write of each CompletionLevel guarantees
  bool delivery_confirmed = true;
  std::size_t segment_bytes = 0, max_rma_size = 0, in_flight_limit = 0, credits = 0, immediate_data_receives = 0;
  std::optional<bool> rma_emulated;
};

struct Entry {
  std::string provider, fabric, domain, addr_format, threading, progress;
  std::vector<std::string> mr_mode, caps, wait_objects;
  std::size_t max_msg_size = 0, rma_iov_limit = 0, tx_size = 0, rx_size = 0;
  std::optional<Uses> uses;
  std::string uses_error;  // why no endpoint opened, when uses is empty
};

/// Opens the endpoint the library would open on this entry's domain and reads what it chose.
void read_uses(Entry& entry, dma::Configuration configuration) {
  configuration.interfaces = {entry.domain};
  // From 1.18 tcp offers native tcp, then rxm: each entry reports the endpoint it would give.
  if (entry.provider.find("ofi_rxm") != std::string::npos) configuration.tcp_protocol = dma::TcpProtocol::rxm;
  dma::Endpoint endpoint;
  std::error_code ec;
  endpoint.open(configuration, ec);
  if (ec) {
    entry.uses_error = endpoint.failed_step() + ": " + ec.message();
    return;
  }
  const dma::EndpointInfo info = endpoint.describe();
  Uses u;
  u.wait_object = info.wait_fd ? "FI_WAIT_FD" : "FI_WAIT_NONE";
  u.delivery = info.delivery_guarantee;
  u.transmit = info.transmit_guarantee;
  u.delivery_confirmed = info.delivery_confirmed;
  u.segment_bytes = info.max_msg_size;
  if (configuration.max_segment_bytes != 0 &&
      (u.segment_bytes == 0 || configuration.max_segment_bytes < u.segment_bytes)) {
    u.segment_bytes = configuration.max_segment_bytes;
  }
  u.max_rma_size = info.max_rma_size;
  u.in_flight_limit = info.in_flight_limit;
  u.credits = info.credits;
  u.immediate_data_receives = info.immediate_data_receives;
  u.rma_emulated = info.rma_emulated;
  entry.uses = u;
}

/// Opens the fabric and domain of info and a CQ with each wait object; nullopt with `why` set if
/// the fabric or domain does not open.
std::optional<Entry> probe(fi_info& info, std::string& why) {
  fid_fabric* fabric = nullptr;
  if (int rc = fi_fabric(info.fabric_attr, &fabric, nullptr); rc != 0) {
    why = std::string("fi_fabric: ") + fi_strerror(-rc);
    return std::nullopt;
  }
  fid_domain* domain = nullptr;
  if (int rc = fi_domain(fabric, &info, &domain, nullptr); rc != 0) {
    why = std::string("fi_domain: ") + fi_strerror(-rc);
    fi_close(&fabric->fid);
    return std::nullopt;
  }
  Entry e;
  e.provider = info.fabric_attr->prov_name != nullptr ? info.fabric_attr->prov_name : "";
  e.fabric = info.fabric_attr->name != nullptr ? info.fabric_attr->name : "";
  e.domain = info.domain_attr->name != nullptr ? info.domain_attr->name : "";
  e.addr_format = name_of(&info.addr_format, FI_TYPE_ADDR_FORMAT);
  e.threading = name_of(&info.domain_attr->threading, FI_TYPE_THREADING);
  e.progress = name_of(&info.domain_attr->data_progress, FI_TYPE_PROGRESS);
  const int mr_mode = info.domain_attr->mr_mode;
  e.mr_mode = names_of(&mr_mode, FI_TYPE_MR_MODE);
  e.caps = names_of(&info.caps, FI_TYPE_CAPS);
  e.max_msg_size = info.ep_attr->max_msg_size;
  e.rma_iov_limit = info.tx_attr->rma_iov_limit;
  e.tx_size = info.tx_attr->size;
  e.rx_size = info.rx_attr->size;
  for (const auto& [wait, name] : wait_objects) {
    fi_cq_attr attr{};
    attr.format = FI_CQ_FORMAT_CONTEXT;
    attr.wait_obj = wait;
    attr.size = 16;
    fid_cq* cq = nullptr;
    if (fi_cq_open(domain, &attr, &cq, nullptr) == 0) {
      e.wait_objects.emplace_back(name);
      fi_close(&cq->fid);
    }
  }
  fi_close(&domain->fid);
  fi_close(&fabric->fid);
  return e;
}

/// Every usable entry of one provider; `tried` gets one line saying what was asked and found.
std::vector<Entry> discover(const dma::Configuration& base, dma::Provider provider,
                            const std::optional<std::string>& bind, std::vector<std::string>& tried) {
  dma::Configuration configuration = base;
  configuration.providers = {provider};
  configuration.bind = bind;
  std::error_code ec;
  std::string what;
  auto list = dma::query_fabric_info(configuration, ec, what);
  const std::string label = std::string(dma::to_string(provider));
  if (ec) {
    tried.push_back(label + ": " + (what.empty() ? ec.message() : what));
    return {};
  }
  std::vector<Entry> entries;
  std::set<std::tuple<std::string, std::string, std::string, std::string>> seen;
  std::string failures;
  for (fi_info* info = list.get(); info != nullptr; info = info->next) {
    std::string why;
    auto entry = probe(*info, why);
    if (!entry) {
      failures += (failures.empty() ? "" : "; ") + why;
      continue;
    }
    if (!seen.insert({entry->provider, entry->fabric, entry->domain, entry->addr_format}).second) continue;
    read_uses(*entry, configuration);
    entries.push_back(std::move(*entry));
  }
  if (entries.empty()) tried.push_back(label + ": fi_getinfo found entries, none opened: " + failures);
  return entries;
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", c);
      out += escape;
    } else {
      out += c;
    }
  }
  return out + '"';
}

std::string json_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i)
    out += (i > 0 ? ", " : "") + quoted(items[i]);
  return out + "]";
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items)
    out += (out.empty() ? "" : "|") + item;
  return out.empty() ? "-" : out;
}

std::string json_uses(const Entry& e) {
  if (!e.uses) return "null, \"uses_error\": " + quoted(e.uses_error);
  const Uses& u = *e.uses;
  char numbers[256];
  std::snprintf(numbers, sizeof numbers,
                "\"segment_bytes\": %zu, \"max_rma_size\": %zu, \"in_flight_limit\": %zu, \"credits\": %zu, "
                "\"immediate_data_receives\": %zu",
                u.segment_bytes, u.max_rma_size, u.in_flight_limit, u.credits, u.immediate_data_receives);
  return "{\"wait_object\": " + quoted(u.wait_object) +
         ", \"polls\": " + (u.wait_object == "FI_WAIT_FD" ? "false" : "true") +
         ", \"completion\": {\"delivery\": " + quoted(u.delivery) + ", \"transmit\": " + quoted(u.transmit) +
         "}, \"delivery_confirmed\": " + (u.delivery_confirmed ? "true" : "false") + ", " + numbers +
         ", \"immediate_data_needs_receives\": " + (u.immediate_data_receives != 0 ? "true" : "false") +
         ", \"rma_emulated\": " + (u.rma_emulated ? (*u.rma_emulated ? "true" : "false") : "null") + "}";
}

void print_json(const std::vector<Entry>& entries) {
  std::printf("{\n  \"dma_libfabric\": %s,\n  \"libfabric\": %s,\n  \"entries\": [\n",
              quoted(std::string(dma::version())).c_str(), quoted(dma::fabric_version()).c_str());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    std::printf(
        "    {\"provider\": %s, \"fabric\": %s, \"domain\": %s, \"addr_format\": %s, \"mr_mode\": %s, "
        "\"caps\": %s, \"max_msg_size\": %zu, \"rma_iov_limit\": %zu, \"tx_size\": %zu, \"rx_size\": %zu, "
        "\"wait_objects\": %s, \"threading\": %s, \"data_progress\": %s, \"libfabric\": %s, \"uses\": %s}%s\n",
        quoted(e.provider).c_str(), quoted(e.fabric).c_str(), quoted(e.domain).c_str(), quoted(e.addr_format).c_str(),
        json_list(e.mr_mode).c_str(), json_list(e.caps).c_str(), e.max_msg_size, e.rma_iov_limit, e.tx_size, e.rx_size,
        json_list(e.wait_objects).c_str(), quoted(e.threading).c_str(), quoted(e.progress).c_str(),
        quoted(dma::fabric_version()).c_str(), json_uses(e).c_str(), i + 1 < entries.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

void print_text(const std::vector<Entry>& entries) {
  std::printf("dma-libfabric %s, libfabric %s\n", std::string(dma::version()).c_str(), dma::fabric_version().c_str());
  for (const auto& e : entries) {
    std::printf("\nprovider: %s\nfabric: %s\ndomain: %s\naddr_format: %s\nmr_mode: %s\ncaps: %s\n", e.provider.c_str(),
                e.fabric.c_str(), e.domain.c_str(), e.addr_format.c_str(), joined(e.mr_mode).c_str(),
                joined(e.caps).c_str());
    std::printf("max_msg_size: %zu\nrma_iov_limit: %zu\ntx_size: %zu\nrx_size: %zu\nwait_objects: %s\n", e.max_msg_size,
                e.rma_iov_limit, e.tx_size, e.rx_size, joined(e.wait_objects).c_str());
    std::printf("threading: %s\ndata_progress: %s\n", e.threading.c_str(), e.progress.c_str());
    if (!e.uses) {
      std::printf("library uses: nothing (%s)\n", e.uses_error.c_str());
      continue;
    }
    const Uses& u = *e.uses;
    std::printf("library uses:\n  wait object: %s%s\n  delivery completion: %s\n  transmit completion: %s\n",
                u.wait_object.c_str(), u.wait_object == "FI_WAIT_FD" ? "" : " (progress polls)", u.delivery.c_str(),
                u.transmit.c_str());
    std::printf("  segment bytes: %zu\n  max RMA size: %s\n  in-flight limit: %zu\n  credits per peer: %zu\n",
                u.segment_bytes, u.max_rma_size != 0 ? std::to_string(u.max_rma_size).c_str() : "not reported",
                u.in_flight_limit, u.credits);
    std::printf("  immediate data needs posted receives: %s\n",
                u.immediate_data_receives != 0 ? ("yes, " + std::to_string(u.immediate_data_receives)).c_str() : "no");
    if (u.rma_emulated) std::printf("  RMA emulated: %s\n", *u.rma_emulated ? "yes" : "no");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("dma-info: the providers and domains dma-libfabric can open on this machine, with libfabric's names",
               "dma-info");
  app.set_version_flag("--version", "dma-info (dma-libfabric) " + std::string(dma::version()));
  std::vector<std::string> providers;
  std::optional<std::string> bind;
  bool json = false;
  std::string config;
  app.add_option("--config", config,
                 "TOML file whose [dma-libfabric] table to ask about: its provider, bind and interfaces (--provider "
                 "and --bind override them)");
  app.add_option("--provider", providers, "only these providers (repeatable): tcp, efa-direct, shm")
      ->check(CLI::IsMember({"tcp", "efa-direct", "shm"}));
  app.add_option("--bind", bind, "source address for fi_getinfo (FI_SOURCE), e.g. 127.0.0.1");
  app.add_flag("--json", json, "print JSON instead of text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : 2;
  }

  dma::Configuration base;
  if (!config.empty()) {
    std::error_code ec;
    std::string message;
    base = dma::Configuration::from_toml(config, dma::Configuration::default_section, ec, message);
    if (ec) {
      std::fprintf(stderr, "--config: %s\nRun with --help for more information.\n", message.c_str());
      return 2;
    }
    if (providers.empty()) {
      providers = {std::string(dma::to_string(base.providers.empty() ? dma::Provider::tcp : base.providers.front()))};
    }
    if (!bind) bind = base.bind;
  }
  if (providers.empty()) providers = {"tcp", "efa-direct", "shm"};
  std::vector<Entry> entries;
  std::vector<std::string> tried;
  for (const auto& name : providers) {
    const auto provider = dma::from_string<dma::Provider>(name).value_or(dma::Provider::tcp);
    auto found = discover(base, provider, bind, tried);
    entries.insert(entries.end(), found.begin(), found.end());
  }
  if (entries.empty()) {
    std::fprintf(stderr, "dma-info: nothing usable found with libfabric %s; tried:\n", dma::fabric_version().c_str());
    for (const auto& line : tried)
      std::fprintf(stderr, "  %s\n", line.c_str());
    return 2;
  }
  for (const auto& line : tried)  // a provider that is absent while another works
    std::fprintf(stderr, "dma-info: not available: %s\n", line.c_str());
  if (json) {
    print_json(entries);
  } else {
    print_text(entries);
  }
  return 0;
}
