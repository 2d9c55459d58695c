#include "hints.hpp"

#include "dma/error.hpp"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace dma::detail {
namespace {

// Before 1.18, tcp offers RDM only through rxm; naming the layering keeps fi_getinfo from ever
// resolving to `net`, whose wait fd stays readable while idle.
std::string hinted_provider_name(Provider provider) {
  std::string name(provider_name(provider));
  const auto version = fi_version();
  if (provider == Provider::tcp && FI_MAJOR(version) == 1 && FI_MINOR(version) < 18) name += ";ofi_rxm";
  return name;
}

void set_hints(fi_info& hints, Provider provider) {
  hints.caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints.ep_attr->type = FI_EP_RDM;
  hints.domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
  // Every call for one endpoint runs on one strand, so the provider may skip its own locks.
  hints.domain_attr->threading = FI_THREAD_DOMAIN;
  hints.fabric_attr->prov_name = strdup(hinted_provider_name(provider).c_str());
  if (const auto fabric = fabric_name(provider)) hints.fabric_attr->name = strdup(std::string(*fabric).c_str());
  if (provider == Provider::efa_direct) hints.mode |= FI_CONTEXT2;  // efa-direct requires it
}

}  // namespace

// rxm keeps a connection in its table after the peer tore it down until it happens to process
// the shutdown event, so an entry removed and inserted again can still name the dead connection
// and fail the next transfer with FI_ENOTCONN. With FI_AV_REMOVE_CLEANUP, fi_av_remove closes the
// connection at once: removing a peer frees its socket, and a fresh entry reconnects. libfabric
// reads the variable once, when it initialises; a value the user set is kept.
void prepare_environment() noexcept {
  static const bool done = [] {
    (void)::setenv("FI_AV_REMOVE_CLEANUP", "1", 0);
    return true;
  }();
  (void)done;
}

InfoList query_info(const Configuration& configuration, std::error_code& ec, std::string& what) {
  const Provider provider = configuration.providers.empty() ? Provider::tcp : configuration.providers.front();
  InfoList hints(fi_allocinfo());
  if (!hints) {
    ec = fabric_error(-FI_ENOMEM);
    what = "fi_allocinfo failed";
    return {};
  }
  set_hints(*hints, provider);
  const char* node = configuration.bind ? configuration.bind->c_str() : nullptr;
  if (configuration.bind && configuration.bind->find('\0') != std::string::npos) {
    ec = errc::invalid_configuration;
    what = "invalid source node";
    return {};
  }
  const std::string port = configuration.port ? std::to_string(*configuration.port) : std::string();
  const char* service = configuration.port ? port.c_str() : nullptr;
  const bool source = node != nullptr || service != nullptr;
  prepare_environment();
  fi_info* list = nullptr;
  const int code = fi_getinfo(FI_VERSION(1, 17), node, service, source ? FI_SOURCE : 0, hints.get(), &list);
  if (code != 0) {
    ec = code == -FI_ENODATA ? make_error_code(errc::no_provider) : fabric_error(code);
    what = "fi_getinfo found no " + std::string(to_string(provider)) + " provider" +
           (node != nullptr ? " for " + std::string(node) : std::string()) + ": " + fi_strerror(-code);
    return {};
  }
  if (list == nullptr) {
    ec = errc::no_provider;
    what = "no provider matched";
  }
  return InfoList(list);
}

}  // namespace dma::detail
