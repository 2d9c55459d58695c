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
        return condition::invalid_operand;
      case errc::progress_deadline:
        return condition::peer_unreachable;
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
      case FI_ECONNREFUSED:
      case FI_ECONNRESET:
      case FI_ECONNABORTED:
      case FI_EHOSTUNREACH:
      case FI_ENETUNREACH:
      case FI_ETIMEDOUT:
      case FI_EADDRNOTAVAIL:
        return condition::peer_unreachable;
      default:
        break;
    }
    // libfabric's small codes are errno values; let them compare equal to std::errc.
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
