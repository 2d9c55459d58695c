#include "dma/error.hpp"

#include <rdma/fi_errno.h>

#include <cerrno>
#include <cstdlib>
#include <system_error>

namespace dma {
namespace {

class LibraryCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dma"; }

  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::advertisement_arity:
        return "expected: address rkey remote-address";
      case errc::advertisement_hex:
        return "invalid hex in address";
      case errc::advertisement_integer:
        return "invalid integer in advertisement";
      case errc::address_length:
        return "advertised address has the wrong length for this endpoint's address format";
      case errc::address_family:
        return "advertised address family does not match this endpoint's address format";
      case errc::address_port_zero:
        return "advertised address has port 0";
      case errc::address_unspecified:
        return "advertised address is unspecified (0.0.0.0 or ::)";
      case errc::address_multicast:
        return "advertised address is a multicast address";
      case errc::address_broadcast:
        return "advertised address is the broadcast address";
      case errc::address_format_unsupported:
        return "this endpoint's address format cannot be validated";
      case errc::advertisement_too_long:
        return "advertisement is longer than 512 characters";
      case errc::no_source:
        return "the caller context supplied no source bytes for a ToPeer transfer";
      case errc::no_landing_buffer:
        return "the caller context allocated no landing buffer for a FromPeer transfer";
      case errc::landing_buffer_too_small:
        return "the caller context allocated fewer bytes than the FromPeer transfer reads";
      case errc::operand_range_overflows:
        return "local operand range overflows";
      case errc::progress_deadline:
        return "no progress posting within progress_deadline: peer unreachable or transmit queue stuck";
      case errc::peer_removed:
        return "the peer was removed before the transfer was posted";
      case errc::shutdown:
        return "fabric service is gone";
      case errc::null_op_context:
        return "completion carried a null op_context";
      case errc::no_provider:
        return "no provider matched";
      case errc::no_domain:
        return "no fabric domain with the configured interface name";
      case errc::not_open:
        return "not open";
      case errc::zero_length_region:
        return "cannot register 0 bytes";
      case errc::region_range_overflows:
        return "registered region range overflows";
      case errc::invalid_configuration:
        return "invalid configuration";
      case errc::av_insert_failed:
        return "fi_av_insert inserted 0 of 1 addresses";
      case errc::timed_out:
        return "the transfer did not complete within its deadline";
      case errc::connection_refused:
        return "no connection to the peer within progress_deadline: nothing listens at its address, or the "
               "peer is down or not progressing";
      case errc::connection_lost:
        return "the connection to the peer broke with this transfer on it: the peer died, restarted or closed "
               "it, or rejected a transfer on it (a wrong key, a range outside its region, missing access "
               "rights; tcp reports all of these alike)";
      case errc::peer_unreachable:
        return "the peer is marked unreachable and its back-off has not ended";
      case errc::connection_rejected:
        return "the peer's address accepts TCP connections but not libfabric's connection request: most often "
               "the two ends speak different wire protocols (native tcp, libfabric 1.18 and later, against "
               "tcp;ofi_rxm as libfabric 1.17 speaks it: set tcp_protocol = \"rxm\" on the newer end; or rxm "
               "with different eager limits), else the peer is not progressing";
      case errc::remote_access_denied:
        return "the peer refused the access: wrong key, range outside its region, or missing access rights";
      case errc::immediate_data_on_read:
        return "immediate data can only be sent with a ToPeer transfer (a write), not a FromPeer one";
      case errc::immediate_data_too_wide:
        return "the immediate data needs more bytes than the provider's cq_data_size carries";
      case errc::notifications_lost:
        return "write notifications were lost: the target's notification queue was full";
      case errc::segment_lengths_differ:
        return "the local buffers and the remote segments of the transfer do not total the same length";
      case errc::no_remote_segment:
        return "the transfer names an empty list of remote segments";
      case errc::remote_range_overflows:
        return "a remote segment's address plus its length wraps around";
    }
    return "unknown dma error " + std::to_string(value);
  }

  std::error_condition default_error_condition(int value) const noexcept override {
    switch (static_cast<errc>(value)) {
      case errc::advertisement_arity:
      case errc::advertisement_hex:
      case errc::advertisement_integer:
      case errc::address_length:
      case errc::address_family:
      case errc::address_port_zero:
      case errc::address_unspecified:
      case errc::address_multicast:
      case errc::address_broadcast:
      case errc::address_format_unsupported:
      case errc::advertisement_too_long:
        return condition::invalid_advertisement;
      case errc::no_source:
      case errc::no_landing_buffer:
      case errc::landing_buffer_too_small:
      case errc::operand_range_overflows:
      case errc::immediate_data_on_read:
      case errc::immediate_data_too_wide:
      case errc::segment_lengths_differ:
      case errc::no_remote_segment:
      case errc::remote_range_overflows:
        return condition::invalid_operand;
      case errc::progress_deadline:
      case errc::connection_refused:
      case errc::connection_rejected:
      case errc::peer_unreachable:
        return condition::peer_unreachable;
      case errc::connection_lost:
        return condition::connection_lost;
      case errc::remote_access_denied:
        return condition::remote_access_denied;
      case errc::timed_out:
        return std::errc::timed_out;
      case errc::peer_removed:
      case errc::shutdown:
        return condition::cancelled;
      default:
        return {value, *this};
    }
  }
};

class FabricCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "libfabric"; }
  std::string message(int value) const override { return fi_strerror(value); }

  std::error_condition default_error_condition(int value) const noexcept override {
    switch (value) {
      case FI_ECANCELED:
      case FI_ENOTCONN:
      case FI_ECONNRESET:
      case FI_ECONNABORTED:
      case EPIPE:
        return condition::connection_lost;
      case FI_ECONNREFUSED:
      case FI_EHOSTUNREACH:
      case FI_ENETUNREACH:
      case FI_EADDRNOTAVAIL:
        return condition::peer_unreachable;
      case FI_EACCES:
      case FI_EKEYREJECTED:
        return condition::remote_access_denied;
      default:
        break;
    }
    return generic(value);
  }

  // A code compares equal to its dma condition and, where it is an errno value, to std::errc too.
  bool equivalent(int value, const std::error_condition& condition) const noexcept override {
    return default_error_condition(value) == condition || generic(value) == condition;
  }

 private:
  // libfabric's small codes are errno values; let them compare equal to std::errc.
  std::error_condition generic(int value) const noexcept {
    if (value < FI_ERRNO_OFFSET) return std::generic_category().default_error_condition(value);
    return {value, *this};
  }
};

class ConditionCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dma.condition"; }
  std::string message(int value) const override {
    switch (static_cast<condition>(value)) {
      case condition::invalid_advertisement:
        return "invalid advertisement";
      case condition::peer_unreachable:
        return "peer unreachable";
      case condition::invalid_operand:
        return "invalid operand";
      case condition::cancelled:
        return "cancelled by the library";
      case condition::connection_lost:
        return "connection to the peer lost";
      case condition::remote_access_denied:
        return "remote access denied";
    }
    return "unknown dma condition " + std::to_string(value);
  }
};

}  // namespace

const std::error_category& category() noexcept {
  static const LibraryCategory instance;
  return instance;
}

const std::error_category& fabric_category() noexcept {
  static const FabricCategory instance;
  return instance;
}

const std::error_category& condition_category() noexcept {
  static const ConditionCategory instance;
  return instance;
}

std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), category()}; }

std::error_condition make_error_condition(condition c) noexcept { return {static_cast<int>(c), condition_category()}; }

std::error_code fabric_error(long long code) noexcept {
  return {static_cast<int>(code < 0 ? -code : code), fabric_category()};
}

void throw_if(const std::error_code& ec, const std::string& what) {
  if (ec) throw std::system_error(ec, what);
}

}  // namespace dma
