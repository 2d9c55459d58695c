/// @file
/// The fabric core: one RDM endpoint with its fabric, domain, address vector and completion queue.
/// Knows nothing of Asio or coroutines; the services and Target build on it.
#pragma once

#include <dma/configuration.hpp>
#include <dma/detail/fid.hpp>
#include <dma/export.hpp>
#include <dma/log.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace dma {

/// What an endpoint ended up with; lines() is the `DMA.INFO`-style diagnostic of the Rust crate.
struct DMA_EXPORT EndpointInfo {
  std::string provider;                  ///< fabric_attr->prov_name, e.g. "tcp;ofi_rxm"
  std::string fabric;                    ///< fabric_attr->name
  std::string domain;                    ///< domain_attr->name
  std::uint32_t addr_format = 0;         ///< fi_info::addr_format, e.g. FI_SOCKADDR_IN (2) on tcp
  std::uint64_t mr_mode = 0;             ///< domain_attr->mr_mode bits
  std::uint64_t caps = 0;                ///< fi_info::caps bits
  bool requires_local_mr = false;        ///< local operands are registered (FI_MR_LOCAL, or forced)
  bool uses_virtual_addressing = false;  ///< remote addresses are VAs (FI_MR_VIRT_ADDR), not offsets
  std::size_t tx_size = 0;               ///< tx_attr->size
  std::size_t cq_size = 0;               ///< completion queue entries
  std::size_t credits = 0;               ///< transfers the service posts at once to one peer
  std::size_t in_flight_limit = 0;       ///< transfers posted at once to all peers: min(tx_size, cq_size)
  bool wait_fd = false;                  ///< whether the CQ has an FI_WAIT_FD descriptor
  std::size_t cq_data_size = 0;          ///< domain_attr->cq_data_size: bytes of immediate data a write carries
  std::size_t max_msg_size = 0;          ///< the most bytes one post moves: ep_attr->max_msg_size, at most max_rma_size
  /// FI_OPT_MAX_RMA_SIZE: the most bytes one RMA moves (on efa-direct the device's largest RDMA,
  /// which its max_msg_size may exceed); 0 where the provider does not answer (libfabric 1.17).
  std::size_t max_rma_size = 0;
  /// efa: whether its RMA is emulated by messages (FI_OPT_EFA_EMULATED_WRITE; always false on
  /// efa-direct); none where the provider has no such option.
  std::optional<bool> rma_emulated;
  /// Whether a write of CompletionLevel::delivery completes only once the peer has the bytes.
  /// False on efa-direct, whose RMA ignores FI_DELIVERY_COMPLETE: there the peer's Target
  /// notification (a write with immediate data) is what says the bytes have landed.
  bool delivery_confirmed = true;
  /// Receives a Target posts for peers' writes with immediate data, each such write consuming
  /// one (the provider answered FI_RX_CQ_DATA: efa-direct from libfabric 2.4); 0 where none are needed.
  std::size_t immediate_data_receives = 0;
  std::size_t iov_limit = 0;      ///< tx_attr->iov_limit: local buffers per post
  std::size_t rma_iov_limit = 0;  ///< tx_attr->rma_iov_limit: remote segments per post
  /// What a completed write of CompletionLevel::delivery guarantees here, in one sentence.
  std::string delivery_guarantee;
  /// What a completed write of CompletionLevel::transmit guarantees here, in one sentence.
  std::string transmit_guarantee;

  /// provider, addr_format, mr_mode, caps, requires_local_mr, uses_virtual_addressing: the seed's
  /// six lines, with libfabric's own names (fi_tostr_r) for the address format and every flag.
  std::vector<std::string> lines() const;
};

/// Each domain name the configured provider offers, once, in libfabric's order: the values
/// Configuration::interfaces takes. To serve every device, give a service one endpoint per domain
/// (Configuration::endpoints) or start one service per domain. Calls fi_getinfo; throws
/// std::system_error when it fails.
DMA_EXPORT std::vector<std::string> discover_domains(const Configuration& configuration);
/// As discover_domains(configuration), reporting a failure through `ec` with an empty result.
DMA_EXPORT std::vector<std::string> discover_domains(const Configuration& configuration, std::error_code& ec);

/// libfabric's answer to the hints the library opens an endpoint with (fi_getinfo for the first
/// configured provider, its bind address and interfaces): every entry, in libfabric's order, for
/// a tool that reports what a provider offers beyond EndpointInfo, as dma-info does. Reading the
/// entries needs libfabric's headers; freeing the list does not. On failure, an empty list, `ec`
/// set and `failed_step` naming the step (e.g. "fi_getinfo").
DMA_EXPORT detail::InfoList query_fabric_info(const Configuration& configuration, std::error_code& ec,
                                              std::string& failed_step);

/// libfabric's runtime version as "major.minor".
DMA_EXPORT std::string fabric_version();

/// One RDM endpoint with its fabric, domain, address vector and completion queue, each closed
/// exactly once. The services and Target own one each; use it directly only for a libfabric call
/// the library lacks. Not thread-safe: one thread (or strand) at a time.
class Endpoint {
 public:
  /// What the completion queue's entries hold.
  enum class CqFormat {
    context,  ///< FI_CQ_FORMAT_CONTEXT: the operation only (the services)
    data,     ///< FI_CQ_FORMAT_DATA: also flags, length and immediate data (a Target's notifications)
  };

  /// A closed endpoint; open() opens it.
  DMA_EXPORT Endpoint() noexcept;
  /// close().
  DMA_EXPORT ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  /// fi_getinfo with the provider's hints, then fabric, domain, AV (FI_AV_MAP), CQ (FI_WAIT_FD, or
  /// no wait object when the provider refuses one or wait_mode is busy_poll), endpoint, binds,
  /// enable. A failure closes whatever was opened and names the step that failed.
  /// Throws std::system_error naming the provider, bind address and step, e.g. "opening the tcp
  /// endpoint bound to 10.9.9.9: fi_endpoint: Cannot assign requested address".
  /// The CQ holds entries of `format`.
  DMA_EXPORT void open(const Configuration& configuration, CqFormat format = CqFormat::context);
  /// As open(configuration, format), reporting a failure through `ec`; failed_step() names the step.
  DMA_EXPORT void open(const Configuration& configuration, std::error_code& ec, CqFormat format = CqFormat::context);
  /// After a failed open: the step that failed, e.g. "fi_av_open".
  const std::string& failed_step() const noexcept { return failed_step_; }
  /// Closes endpoint, CQ, AV, domain and fabric, in that order.
  DMA_EXPORT void close() noexcept;
  /// Closes only the endpoint: the provider then returns every posted operation to the still-open
  /// CQ (as FI_ECANCELED), which is the one way to reclaim operations a hung peer holds.
  void close_endpoint() noexcept { endpoint_.reset(); }
  /// A replaced endpoint and its completion queue, both still open.
  struct Retired {
    detail::Fid<fid_ep> endpoint;  ///< close it first: the provider returns its operations to cq
    detail::Fid<fid_cq> cq;        ///< drain it, then close it
  };
  /// Opens a fresh endpoint with a fresh completion queue (same attributes) on the same domain and
  /// address vector, and makes them the ones endpoint() and cq() return; hands back the previous
  /// pair, still open, so its posted operations can finish. Closing the old endpoint makes the
  /// provider return the rest to the old CQ. A CQ is never shared between endpoints, since rxm
  /// leaves a closed endpoint's descriptors in its CQ's wait set (fi_trywait then reads freed
  /// memory). local_address() and wait_fd() change with it. On failure nothing changes.
  DMA_EXPORT Retired replace_endpoint(std::error_code& ec);
  /// Whether the endpoint is open (false after close() or close_endpoint()).
  bool is_open() const noexcept { return static_cast<bool>(endpoint_); }

  /// The endpoint's fi_getname bytes (taken at open).
  const std::vector<std::uint8_t>& local_address() const noexcept { return local_address_; }
  /// What the endpoint ended up with (a copy; after close(), the last open's values).
  DMA_EXPORT EndpointInfo describe() const;
  /// EndpointInfo::addr_format: the format validate_address() checks peer addresses against.
  std::uint32_t addr_format() const noexcept { return info_.addr_format; }
  /// EndpointInfo::requires_local_mr.
  bool requires_local_mr() const noexcept { return info_.requires_local_mr; }
  /// EndpointInfo::uses_virtual_addressing.
  bool uses_virtual_addressing() const noexcept { return info_.uses_virtual_addressing; }
  /// EndpointInfo::credits: transfers posted at once to one peer.
  std::size_t credits() const noexcept { return info_.credits; }
  /// EndpointInfo::in_flight_limit: transfers posted at once to all peers.
  std::size_t in_flight_limit() const noexcept { return info_.in_flight_limit; }
  /// EndpointInfo::cq_data_size.
  std::size_t cq_data_size() const noexcept { return info_.cq_data_size; }
  /// The write flag for CompletionLevel::transmit: FI_TRANSMIT_COMPLETE on efa-direct,
  /// FI_INJECT_COMPLETE elsewhere (tcp treats FI_TRANSMIT_COMPLETE as FI_DELIVERY_COMPLETE).
  std::uint64_t transmit_complete_flag() const noexcept { return transmit_complete_flag_; }
  /// The completion queue's entry format.
  CqFormat cq_format() const noexcept { return cq_format_; }
  /// The CQ's wait descriptor (owned by libfabric: never close it), or -1 without one.
  int wait_fd() const noexcept { return wait_fd_; }

  /// fi_av_insert of one address; the handle is libfabric's fi_addr_t.
  DMA_EXPORT std::uint64_t insert_address(std::span<const std::uint8_t> address, std::error_code& ec) noexcept;
  /// fi_av_remove of one handle; returns libfabric's code, and logs a failure (warning).
  DMA_EXPORT int remove_address(std::uint64_t handle) noexcept;
  /// fi_mr_reg over [base, base + length) with the given access bits and requested key.
  DMA_EXPORT detail::Fid<fid_mr> register_memory(const void* base, std::size_t length, std::uint64_t access,
                                                 std::uint64_t requested_key, std::error_code& ec) noexcept;

  /// Native handles for the engine and for callers who need a libfabric call the library lacks
  /// (include libfabric's headers for that: the library's leave them out). Never close them: the
  /// Endpoint owns them. Null when closed.
  fid_fabric* fabric() const noexcept { return fabric_.get(); }
  /// The domain (owned by the Endpoint; null when closed).
  fid_domain* domain() const noexcept { return domain_.get(); }
  /// The address vector, FI_AV_MAP (owned by the Endpoint; null when closed).
  fid_av* av() const noexcept { return av_.get(); }
  /// The completion queue, in cq_format() (owned by the Endpoint; null when closed).
  fid_cq* cq() const noexcept { return cq_.get(); }
  /// The FI_EP_RDM endpoint (owned by the Endpoint; null when closed).
  fid_ep* endpoint() const noexcept { return endpoint_.get(); }
  /// The fi_info the endpoint was opened with (owned by the Endpoint; null when closed).
  const fi_info* info() const noexcept { return fi_info_.get(); }

 private:
  void open_chosen(const Configuration& configuration, std::error_code& ec);
  void open_objects(const Configuration& configuration, std::error_code& ec);
  void open_cq(const Configuration& configuration, std::error_code& ec);
  detail::Fid<fid_ep> open_endpoint(std::error_code& ec);
  void read_wait_fd() noexcept;
  void read_rma_limits() noexcept;
  void read_local_address(std::error_code& ec);

  detail::InfoList fi_info_;
  detail::Fid<fid_fabric> fabric_;
  detail::Fid<fid_domain> domain_;
  detail::Fid<fid_av> av_;
  detail::Fid<fid_cq> cq_;
  detail::Fid<fid_ep> endpoint_;
  EndpointInfo info_;
  std::vector<std::uint8_t> local_address_;
  int wait_fd_ = -1;
  CqFormat cq_format_ = CqFormat::context;
  std::uint64_t transmit_complete_flag_;  ///< FI_INJECT_COMPLETE until open() reads the provider's answer
  std::optional<std::size_t> rnr_retry_;  ///< set on every endpoint this opens, before fi_enable
  int cq_wait_object_ = 0;                ///< the CQ's fi_wait_obj, for the CQ a replaced endpoint gets
  std::string failed_step_;
  LogHandler log_handler_;  ///< the configuration's, for the opens and replacements it logs
};

}  // namespace dma
