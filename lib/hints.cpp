#include "hints.hpp"

#include "dma/error.hpp"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace dma::detail {
namespace {

// Before 1.18, tcp offers RDM only through rxm; naming the layering keeps fi_getinfo from ever
// resolving to `net`, whose wait fd stays readable while idle. From 1.18 on, "tcp" alone is the
// native provider, and "tcp;ofi_rxm" still picks rxm, which is what peers on 1.17 speak.
std::string hinted_provider_name(const Configuration& configuration, Provider provider) {
  std::string name(provider_name(provider));
  const bool rxm = configuration.tcp_protocol == TcpProtocol::rxm || tcp_rdm_is_rxm_only(fi_version());
  if (provider == Provider::tcp && rxm) name += ";ofi_rxm";
  return name;
}

}  // namespace

bool tcp_rdm_is_rxm_only(std::uint32_t version) noexcept { return FI_MAJOR(version) == 1 && FI_MINOR(version) < 18; }

bool rxm_eager_limit_is_its_own_setting(std::uint32_t version) noexcept { return tcp_rdm_is_rxm_only(version); }

namespace {

// What native tcp grants when asked (65536 at most); its default is 256, rxm's 2048. It caps the
// in-flight limit a configuration can ask for, and costs nothing until transfers are in flight:
// entries come from a pool that grows with use.
constexpr std::size_t native_tcp_tx_size = 2048;

void set_hints(fi_info& hints, const Configuration& configuration, Provider provider) {
  hints.caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints.ep_attr->type = FI_EP_RDM;
  hints.domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
  // Every call for one endpoint runs on one strand, so the provider may skip its own locks.
  hints.domain_attr->threading = FI_THREAD_DOMAIN;
  hints.fabric_attr->prov_name = strdup(hinted_provider_name(configuration, provider).c_str());
  if (provider == Provider::tcp && hinted_provider_name(configuration, provider) == "tcp") {
    hints.tx_attr->size = native_tcp_tx_size;
  }
  if (const auto fabric = fabric_name(provider)) hints.fabric_attr->name = strdup(std::string(*fabric).c_str());
  if (provider == Provider::efa_direct) hints.mode |= FI_CONTEXT2;  // efa-direct requires it
  // rx_attr->size stays the provider's: with a tiny receive queue (16), rxm 1.17 over tcp crashed
  // in fi_close of an endpoint replaced while a peer was frozen (docs/notes/performance.md).
}

struct ProcessState {
  std::mutex mutex;
  ProcessSettings settings;
  bool applied = false;
};

ProcessState& process_state() {
  static ProcessState state;
  return state;
}

}  // namespace

// FI_AV_REMOVE_CLEANUP: rxm keeps a connection in its table after the peer tore it down until it
// happens to process the shutdown event, so an entry removed and inserted again can still name the
// dead connection and fail the next transfer with FI_ENOTCONN. With it, fi_av_remove closes the
// connection at once: removing a peer frees its socket, and a fresh entry reconnects.
//
// The slim buffers, each of them invisible on the wire (a peer at libfabric's defaults still
// connects; test/interop checks it on every version):
// - rxm over tcp preposts FI_OFI_RXM_MSG_RX_SIZE (4096 with its shared receive context) buffers
//   of FI_OFI_RXM_BUFFER_SIZE (16 KiB) when an endpoint opens, from a pool that it grows 1024
//   buffers at a time and zeroes whole, and takes one buffer of the same size from its transmit
//   pool as the context of every RMA it posts. RMA data never passes through them. The buffer
//   size shrinks only where the eager limit, which rxm's handshake compares, stays apart from it.
// - rxm sizes the tcp completion queue under it for FI_UNIVERSE_SIZE peers with
//   FI_OFI_RXM_MSG_TX_SIZE (128) posts each: 1024 peers make a ring of 2^18 entries, 12 MiB, which
//   becomes resident as completions cycle through it. The library posts at most its in-flight
//   limit at once, far below the 16,384 entries that 64 give.
// - native tcp (1.18 on) gives each of its transfer entries a 16 KiB buffer for unexpected
//   messages, allocated 1024 at a time at the first connection; FI_TCP_MAX_RX_SIZE bounds it.
// See docs/notes/performance.md, "Footprint", and docs/notes/libfabric-versions.md.
//
// libfabric reads these once, when it initialises; a value the user set is kept.
void prepare_environment() noexcept {
  ProcessState& state = process_state();
  std::lock_guard lock(state.mutex);
  if (state.applied) return;
  state.applied = true;
  (void)::setenv("FI_AV_REMOVE_CLEANUP", "1", 0);
  if (!state.settings.slim_buffers) return;
  // rxm sends its eager limit in its connection request and refuses a peer whose limit differs,
  // so the limit must stay rxm's default (16384) for a peer at libfabric's defaults to connect.
  // Only where the limit is a setting of its own can the buffers shrink under it.
  if (rxm_eager_limit_is_its_own_setting(fi_version()) && std::getenv("FI_OFI_RXM_BUFFER_SIZE") == nullptr &&
      std::getenv("FI_OFI_RXM_EAGER_LIMIT") == nullptr) {
    (void)::setenv("FI_OFI_RXM_EAGER_LIMIT", "16384", 0);
    (void)::setenv("FI_OFI_RXM_BUFFER_SIZE", "1024", 0);
  }
  (void)::setenv("FI_OFI_RXM_MSG_RX_SIZE", "128", 0);
  (void)::setenv("FI_UNIVERSE_SIZE", "64", 0);
  // Native tcp's transfer entries each carry a buffer for unexpected messages: 1024 entries of
  // 16 KiB at the first connection. Larger unexpected messages get a buffer of their own.
  (void)::setenv("FI_TCP_MAX_RX_SIZE", "1024", 0);
}

WaitMode progress_wait_mode(const Configuration& configuration) noexcept {
  return configured_provider(configuration) == Provider::shm ? WaitMode::busy_poll : configuration.wait_mode;
}

Provider configured_provider(const Configuration& configuration) noexcept {
  return configuration.providers.empty() ? Provider::tcp : configuration.providers.front();
}

InfoList query_info(const Configuration& configuration, std::error_code& ec, std::string& what) {
  const Provider provider = configured_provider(configuration);
  InfoList hints(fi_allocinfo());
  if (!hints) {
    ec = fabric_error(-FI_ENOMEM);
    what = "fi_allocinfo failed";
    return {};
  }
  if (provider == Provider::tcp && configuration.tcp_protocol == TcpProtocol::native &&
      tcp_rdm_is_rxm_only(fi_version())) {
    ec = errc::invalid_configuration;
    what = "tcp_protocol = native needs libfabric 1.18 or later; this libfabric (" +
           std::to_string(FI_MAJOR(fi_version())) + "." + std::to_string(FI_MINOR(fi_version())) +
           ") has tcp RDM only as tcp;ofi_rxm";
    return {};
  }
  set_hints(*hints, configuration, provider);
  if (configuration.bind && configuration.bind->find('\0') != std::string::npos) {
    ec = errc::invalid_configuration;
    what = "invalid source node";
    return {};
  }
  // shm derives the endpoint's name from the node and service: with a node alone every process's
  // first endpoint gets the same name, and the second one to open fails fi_enable with -FI_EBUSY.
  const bool named_by_node = provider != Provider::shm;
  const char* node = named_by_node && configuration.bind ? configuration.bind->c_str() : nullptr;
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

namespace dma {

bool set_process_settings(const ProcessSettings& settings) noexcept {
  auto& state = detail::process_state();
  std::lock_guard lock(state.mutex);
  if (state.applied) return false;
  state.settings = settings;
  return true;
}

ProcessSettings process_settings() noexcept {
  auto& state = detail::process_state();
  std::lock_guard lock(state.mutex);
  return state.settings;
}

}  // namespace dma
