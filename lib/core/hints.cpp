#include "hints.hpp"

#include "dma/error.hpp"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace dma::detail {
namespace {

// Before 1.18, tcp offers RDM only through rxm; naming the layering keeps fi_getinfo from ever
// resolving to `net`, whose wait fd stays readable while idle. From 1.18 on, "tcp" alone is the
// native provider, and "tcp;ofi_rxm" still picks rxm, which is what peers on 1.17 speak.
std::string hinted_provider_name(const Configuration& configuration, Provider provider, std::uint32_t version) {
  std::string name(provider_name(provider));
  const bool rxm = configuration.tcp_protocol == TcpProtocol::rxm || tcp_rdm_is_rxm_only(version);
  if (provider == Provider::tcp && rxm) name += ";ofi_rxm";
  return name;
}

}  // namespace

bool tcp_rdm_is_rxm_only(std::uint32_t version) noexcept { return FI_MAJOR(version) == 1 && FI_MINOR(version) < 18; }

bool rxm_eager_limit_is_its_own_setting(std::uint32_t version) noexcept { return tcp_rdm_is_rxm_only(version); }

// docs/notes/efa-direct.md has the provider source each of these comes from.
bool efa_direct_cq_takes_wait_fd(std::uint32_t version) noexcept {
  return FI_MAJOR(version) > 2 || (FI_MAJOR(version) == 2 && FI_MINOR(version) >= 3);
}

bool efa_direct_asks_rx_cq_data(std::uint32_t version) noexcept {
  return FI_MAJOR(version) > 2 || (FI_MAJOR(version) == 2 && FI_MINOR(version) >= 4);
}

bool endpoint_answers_size_options(std::uint32_t version) noexcept { return FI_MAJOR(version) >= 2; }

#if FI_MAJOR_VERSION >= 2
// Built against 2.x headers: the declarations above must agree with libfabric's.
static_assert(endpoint_option::shared_memory_permitted == FI_OPT_SHARED_MEMORY_PERMITTED);
static_assert(endpoint_option::max_rma_size == FI_OPT_MAX_RMA_SIZE);
static_assert(endpoint_option::efa_emulated_read == FI_OPT_EFA_EMULATED_READ);
static_assert(endpoint_option::efa_emulated_write == FI_OPT_EFA_EMULATED_WRITE);
#endif
static_assert(endpoint_option::efa_rnr_retry == FI_OPT_EFA_RNR_RETRY);

namespace {

// What native tcp grants when asked (65536 at most); its default is 256, rxm's 2048. It caps the
// in-flight limit a configuration can ask for, and costs nothing until transfers are in flight:
// entries come from a pool that grows with use.
constexpr std::size_t native_tcp_tx_size = 2048;

}  // namespace

void fill_hints(fi_info& hints, const Configuration& configuration, Provider provider, std::uint32_t version) {
  hints.caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints.ep_attr->type = FI_EP_RDM;
  hints.domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
  // Every call for one endpoint runs on one strand, so the provider may skip its own locks.
  hints.domain_attr->threading = FI_THREAD_DOMAIN;
  const std::string name = hinted_provider_name(configuration, provider, version);
  hints.fabric_attr->prov_name = strdup(name.c_str());
  if (provider == Provider::tcp && name == "tcp") {
    hints.tx_attr->size = native_tcp_tx_size;
  }
  if (const auto fabric = fabric_name(provider)) hints.fabric_attr->name = strdup(std::string(*fabric).c_str());
  if (provider == Provider::efa_direct) {
    hints.mode |= FI_CONTEXT2;  // efa-direct requires it
    // Without it a device lacking unsolicited write receive offers no efa-direct with FI_RMA; with
    // it in the answer, the Target posts the receives that writes with immediate data consume.
    if (efa_direct_asks_rx_cq_data(version)) hints.mode |= FI_RX_CQ_DATA;
  }
  // rx_attr->size stays the provider's: with a tiny receive queue (16), rxm 1.17 over tcp crashed
  // in fi_close of an endpoint replaced while a peer was frozen (docs/notes/performance.md).
}

AnswerUse read_answer(const fi_info& answer, const Configuration& configuration, std::uint32_t version) noexcept {
  const Provider provider = configured_provider(configuration);
  AnswerUse use;
  const bool polls = progress_wait_mode(configuration) == WaitMode::busy_poll ||
                     (provider == Provider::efa_direct && !efa_direct_cq_takes_wait_fd(version));
  use.cq_wait = polls ? FI_WAIT_NONE : FI_WAIT_FD;
  // tcp treats FI_TRANSMIT_COMPLETE as FI_DELIVERY_COMPLETE; efa-direct knows only the former.
  use.transmit_flag = provider == Provider::efa_direct ? FI_TRANSMIT_COMPLETE : FI_INJECT_COMPLETE;
  // efa-direct's RMA path takes FI_DELIVERY_COMPLETE and ignores it: its tx op_flags hold only
  // FI_TRANSMIT_COMPLETE, and a write completes when the device reports the work request done.
  use.delivery_confirmed = provider != Provider::efa_direct;
  if ((answer.mode & FI_RX_CQ_DATA) != 0) {
    const std::size_t rx_size = answer.rx_attr != nullptr && answer.rx_attr->size != 0 ? answer.rx_attr->size : 1;
    use.target_receives = std::max<std::size_t>(1, std::min(rx_size, configuration.notification_queue));
  }
  return use;
}

std::string_view completion_guarantee(Provider provider, CompletionLevel level, const AnswerUse& use) noexcept {
  if (level == CompletionLevel::delivery && use.delivery_confirmed) {
    return "the peer has the bytes: a refused write (bad key, range, access) fails";
  }
  if (provider == Provider::efa_direct) {
    return "the device reports the write done and the local buffer may be reused; not that the bytes are in "
           "the peer's memory: the peer's Target notification (immediate data) says that";
  }
  if (provider == Provider::tcp) {
    return "the local buffer may be reused; a write the peer refuses still completes, and the next transfer on "
           "the connection fails";
  }
  return "the local buffer may be reused; that the peer accepted the write is not confirmed";
}

namespace {

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

namespace {

// shm names an endpoint after its node, or, with none, after the process's id ("PID:uid:index" in
// /dev/shm). A process killed with SIGKILL leaves its files behind, and a later process given the
// same id then fails fi_enable with -FI_EBUSY (1.17 never reclaims the file; 2.x only when the
// process that wrote it is gone, and the new one is that id). A node of the process id and 64
// random bits, drawn for each endpoint (a forked child must not reuse its parent's), makes every
// name new.
std::string shm_node() {
  std::uint64_t bits = 0;
  if (::getrandom(&bits, sizeof bits, 0) != static_cast<ssize_t>(sizeof bits)) {
    bits = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           reinterpret_cast<std::uintptr_t>(&bits);
  }
  char name[48];
  std::snprintf(name, sizeof name, "dma-%ld-%016llx", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(bits));
  return name;
}

}  // namespace

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
  fill_hints(*hints, configuration, provider, fi_version());
  if (configuration.bind && configuration.bind->find('\0') != std::string::npos) {
    ec = errc::invalid_configuration;
    what = "invalid source node";
    return {};
  }
  // shm derives the endpoint's name from the node and service: the configured node would give every
  // process's first endpoint the same name, so shm gets a node of its own (shm_node()), and a port
  // alone names it "fi_ns://port".
  const std::string shm_name = provider == Provider::shm && !configuration.port ? shm_node() : std::string();
  const char* node = configuration.bind ? configuration.bind->c_str() : nullptr;
  if (provider == Provider::shm) node = shm_name.empty() ? nullptr : shm_name.c_str();
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
