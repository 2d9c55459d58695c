// The fabric core: one RDM endpoint with its fabric, domain, address vector and completion queue.
// Knows nothing of Asio or coroutines; the services and Target build on it.
#pragma once

#include <dma/configuration.hpp>
#include <dma/detail/fid.hpp>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace dma {

/// What an endpoint ended up with; lines() is the `DMA.INFO`-style diagnostic of the Rust crate.
struct EndpointInfo {
  std::string provider;  ///< fabric_attr->prov_name, e.g. "tcp;ofi_rxm"
  std::string fabric;    ///< fabric_attr->name
  std::string domain;    ///< domain_attr->name
  std::uint32_t addr_format = 0;
  std::uint64_t mr_mode = 0;
  std::uint64_t caps = 0;
  bool requires_local_mr = false;
  bool uses_virtual_addressing = false;
  std::size_t tx_size = 0;  ///< tx_attr->size
  std::size_t cq_size = 0;  ///< completion queue entries
  std::size_t credits = 0;  ///< transfers the service posts at once
  bool wait_fd = false;     ///< whether the CQ has an FI_WAIT_FD descriptor

  /// provider, addr_format, mr_mode, caps, requires_local_mr, uses_virtual_addressing: the seed's
  /// six lines, with libfabric's own names (fi_tostr_r) for the address format and every flag.
  std::vector<std::string> lines() const;
};

/// Each domain name the configured provider offers, once, in libfabric's order.
std::vector<std::string> discover_domains(const Configuration& configuration);
std::vector<std::string> discover_domains(const Configuration& configuration, std::error_code& ec);

/// libfabric's runtime version as "major.minor".
std::string fabric_version();

class Endpoint {
 public:
  Endpoint() noexcept;
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  /// fi_getinfo with the provider's hints, then fabric, domain, AV (FI_AV_MAP), CQ (FI_WAIT_FD, or
  /// no wait object when the provider refuses one or wait_mode is busy_poll), endpoint, binds,
  /// enable. A failure closes whatever was opened and names the step that failed.
  void open(const Configuration& configuration);
  void open(const Configuration& configuration, std::error_code& ec);
  /// After a failed open: the step that failed, e.g. "fi_av_open".
  const std::string& failed_step() const noexcept { return failed_step_; }
  /// Closes endpoint, CQ, AV, domain and fabric, in that order.
  void close() noexcept;
  /// Closes only the endpoint: the provider then returns every posted operation to the still-open
  /// CQ (as FI_ECANCELED), which is the one way to reclaim operations a hung peer holds.
  void close_endpoint() noexcept { endpoint_.reset(); }
  bool is_open() const noexcept { return static_cast<bool>(endpoint_); }

  /// The endpoint's fi_getname bytes (taken at open).
  const std::vector<std::uint8_t>& local_address() const noexcept { return local_address_; }
  EndpointInfo describe() const;
  std::uint32_t addr_format() const noexcept { return info_.addr_format; }
  bool requires_local_mr() const noexcept { return info_.requires_local_mr; }
  bool uses_virtual_addressing() const noexcept { return info_.uses_virtual_addressing; }
  std::size_t credits() const noexcept { return info_.credits; }
  /// The CQ's wait descriptor (owned by libfabric: never close it), or -1 without one.
  int wait_fd() const noexcept { return wait_fd_; }

  /// fi_av_insert of one address.
  fi_addr_t insert_address(std::span<const std::uint8_t> address, std::error_code& ec) noexcept;
  /// fi_av_remove of one handle; returns libfabric's code.
  int remove_address(fi_addr_t handle) noexcept;
  /// fi_mr_reg over [base, base + length) with the given access bits and requested key.
  detail::Fid<fid_mr> register_memory(const void* base, std::size_t length, std::uint64_t access,
                                      std::uint64_t requested_key, std::error_code& ec) noexcept;

  /// Native handles for the engine and for callers who need a libfabric call the library lacks.
  fid_fabric* fabric() const noexcept { return fabric_.get(); }
  fid_domain* domain() const noexcept { return domain_.get(); }
  fid_av* av() const noexcept { return av_.get(); }
  fid_cq* cq() const noexcept { return cq_.get(); }
  fid_ep* endpoint() const noexcept { return endpoint_.get(); }
  const fi_info* info() const noexcept { return fi_info_.get(); }

 private:
  struct InfoDeleter {
    void operator()(fi_info* info) const noexcept;
  };
  void open_objects(const Configuration& configuration, std::error_code& ec);
  void open_cq(const Configuration& configuration, std::error_code& ec);
  void read_local_address(std::error_code& ec);

  std::unique_ptr<fi_info, InfoDeleter> fi_info_;
  detail::Fid<fid_fabric> fabric_;
  detail::Fid<fid_domain> domain_;
  detail::Fid<fid_av> av_;
  detail::Fid<fid_cq> cq_;
  detail::Fid<fid_ep> endpoint_;
  EndpointInfo info_;
  std::vector<std::uint8_t> local_address_;
  int wait_fd_ = -1;
  std::string failed_step_;
};

}  // namespace dma
