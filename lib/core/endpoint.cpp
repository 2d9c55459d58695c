#include "dma/endpoint.hpp"

#include "dma/advertisement.hpp"
#include "dma/error.hpp"
#include "hints.hpp"
#include "log.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace dma {
namespace {

// libfabric's own names for a value of one of its types (fi_tostr_r), e.g. "FI_MSG | FI_RMA" for
// FI_TYPE_CAPS, joined as the seed's lines join flags ("FI_MSG|FI_RMA").
std::string libfabric_names(const void* value, fi_type type) {
  char buffer[1024] = {};
  const char* text = fi_tostr_r(buffer, sizeof buffer, value, type);
  std::string out;
  for (const char* c = text != nullptr ? text : ""; *c != '\0'; ++c) {
    if (*c == ' ' || *c == '\n') continue;
    out += *c == ',' ? '|' : *c;
  }
  return out;
}

std::string hex(std::uint64_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "0x%llx", static_cast<unsigned long long>(value));
  return buffer;
}

const char* or_empty(const char* text) { return text != nullptr ? text : ""; }

fi_cq_attr cq_attributes(Endpoint::CqFormat format, std::size_t size, int wait_object) noexcept {
  fi_cq_attr attr{};
  attr.format = format == Endpoint::CqFormat::data ? FI_CQ_FORMAT_DATA : FI_CQ_FORMAT_CONTEXT;
  attr.size = size;
  attr.wait_obj = static_cast<fi_wait_obj>(wait_object);
  return attr;
}

}  // namespace

namespace {

std::string addr_format_name(std::uint32_t addr_format) { return libfabric_names(&addr_format, FI_TYPE_ADDR_FORMAT); }

std::string mr_mode_names(std::uint64_t mr_mode) {
  const int mode = static_cast<int>(mr_mode);  // fi_tostr reads FI_TYPE_MR_MODE as an int
  return libfabric_names(&mode, FI_TYPE_MR_MODE);
}

std::string caps_names(std::uint64_t caps) { return libfabric_names(&caps, FI_TYPE_CAPS); }

}  // namespace

std::vector<std::string> EndpointInfo::lines() const {
  return {
      "provider: " + provider,
      "addr_format: " + addr_format_name(addr_format),
      "mr_mode: " + hex(mr_mode) + " [" + mr_mode_names(mr_mode) + "]",
      "caps: " + hex(caps) + " [" + caps_names(caps) + "]",
      std::string("requires_local_mr: ") + (requires_local_mr ? "true" : "false"),
      std::string("uses_virtual_addressing: ") + (uses_virtual_addressing ? "true" : "false"),
  };
}

std::string fabric_version() {
  const auto version = fi_version();
  return std::to_string(FI_MAJOR(version)) + "." + std::to_string(FI_MINOR(version));
}

detail::InfoList query_fabric_info(const Configuration& configuration, std::error_code& ec, std::string& failed_step) {
  failed_step.clear();
  return detail::query_info(configuration, ec, failed_step);
}

std::vector<std::string> discover_domains(const Configuration& configuration, std::error_code& ec) {
  std::string what;
  auto list = detail::query_info(configuration, ec, what);
  std::vector<std::string> names;
  if (ec) return names;
  for (const fi_info* entry = list.get(); entry != nullptr; entry = entry->next) {
    if (entry->domain_attr == nullptr || entry->domain_attr->name == nullptr) continue;
    std::string name = entry->domain_attr->name;
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  return names;
}

std::vector<std::string> discover_domains(const Configuration& configuration) {
  std::error_code ec;
  auto names = discover_domains(configuration, ec);
  throw_if(ec, "discover_domains");
  return names;
}

Endpoint::Endpoint() noexcept : transmit_complete_flag_(FI_INJECT_COMPLETE) {}

Endpoint::~Endpoint() { close(); }

void Endpoint::close() noexcept {
  endpoint_.reset();
  cq_.reset();
  av_.reset();
  domain_.reset();
  fabric_.reset();
  fi_info_.reset();
  wait_fd_ = -1;
  local_address_.clear();
}

void Endpoint::open(const Configuration& configuration, CqFormat format) {
  std::error_code ec;
  open(configuration, ec, format);
  if (!ec) return;
  const Provider provider = configuration.providers.empty() ? Provider::tcp : configuration.providers.front();
  std::string what = "opening the " + std::string(to_string(provider)) + " endpoint";
  if (configuration.bind) what += " bound to " + *configuration.bind;
  throw std::system_error(ec, what + ": " + failed_step_);
}

void Endpoint::open(const Configuration& configuration, std::error_code& ec, CqFormat format) {
  close();
  failed_step_.clear();
  cq_format_ = format;
  log_handler_ = configuration.log_handler;
  open_chosen(configuration, ec);
  const detail::Log log(log_handler_);
  if (ec) {
    log(LogLevel::debug, [&] { return "endpoint not opened: " + failed_step_ + ": " + ec.message(); });
    return;
  }
  log(LogLevel::info, [&] {
    return "endpoint opened: provider " + info_.provider + ", fabric " + info_.fabric + ", domain " + info_.domain +
           ", address " + encode_hex(local_address_) + ", credits " + std::to_string(info_.credits) +
           ", in-flight limit " + std::to_string(info_.in_flight_limit) + ", cq_size " + std::to_string(info_.cq_size) +
           (info_.wait_fd ? ", wait fd" : ", no wait fd");
  });
}

void Endpoint::open_chosen(const Configuration& configuration, std::error_code& ec) {
  auto list = detail::query_info(configuration, ec, failed_step_);
  if (ec) return;
  const fi_info* chosen = list.get();
  if (!configuration.interfaces.empty()) {
    const auto& wanted = configuration.interfaces.front();
    while (chosen != nullptr && (chosen->domain_attr->name == nullptr || wanted != chosen->domain_attr->name)) {
      chosen = chosen->next;
    }
    if (chosen == nullptr) {
      ec = errc::no_domain;
      failed_step_ = "no fabric domain named \"" + wanted + "\"";
      return;
    }
  }
  fi_info_.reset(fi_dupinfo(chosen));
  if (!fi_info_) {
    ec = fabric_error(-FI_ENOMEM);
    failed_step_ = "fi_dupinfo";
    return;
  }
  open_objects(configuration, ec);
  if (ec) close();
}

void Endpoint::open_objects(const Configuration& configuration, std::error_code& ec) {
  const fi_info& info = *fi_info_;
  info_.provider = or_empty(info.fabric_attr->prov_name);
  info_.fabric = or_empty(info.fabric_attr->name);
  info_.domain = or_empty(info.domain_attr->name);
  info_.addr_format = info.addr_format;
  info_.mr_mode = static_cast<std::uint64_t>(info.domain_attr->mr_mode);
  info_.caps = info.caps;
  info_.requires_local_mr = (info.domain_attr->mr_mode & FI_MR_LOCAL) != 0 || configuration.force_local_registration;
  info_.uses_virtual_addressing = (info.domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  info_.tx_size = info.tx_attr->size;
  info_.cq_data_size = info.domain_attr->cq_data_size;
  info_.max_msg_size = info.ep_attr->max_msg_size;
  info_.iov_limit = info.tx_attr->iov_limit;
  info_.rma_iov_limit = info.tx_attr->rma_iov_limit;
  const detail::AnswerUse use = detail::read_answer(info, configuration, fi_version());
  transmit_complete_flag_ = use.transmit_flag;
  info_.delivery_confirmed = use.delivery_confirmed;
  info_.immediate_data_receives = use.target_receives;
  const Provider provider = detail::configured_provider(configuration);
  info_.delivery_guarantee = detail::completion_guarantee(provider, CompletionLevel::delivery, use);
  info_.transmit_guarantee = detail::completion_guarantee(provider, CompletionLevel::transmit, use);
  info_.max_rma_size = 0;
  info_.rma_emulated.reset();
  rnr_retry_.reset();
  if (detail::configured_provider(configuration) == Provider::efa_direct) rnr_retry_ = configuration.efa_rnr_retry;

  auto check = [&](int code, const char* step) {
    if (code != 0) {
      ec = fabric_error(code);
      failed_step_ = step;
    }
    return !ec;
  };
  if (!check(fi_fabric(info.fabric_attr, fabric_.out(), nullptr), "fi_fabric")) return;
  if (!check(fi_domain(fabric_.get(), fi_info_.get(), domain_.out(), nullptr), "fi_domain")) return;
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_MAP;
  if (!check(fi_av_open(domain_.get(), &av_attr, av_.out(), nullptr), "fi_av_open")) return;
  open_cq(configuration, ec);
  if (ec) return;
  endpoint_ = open_endpoint(ec);
  if (ec) return;
  read_rma_limits();
  read_local_address(ec);
}

// The engine sizes segments by the fi_info's max_msg_size; efa-direct's may be the larger of the
// device's message and RDMA limits, so an RMA is held to FI_OPT_MAX_RMA_SIZE by lowering it here.
void Endpoint::read_rma_limits() noexcept {
  if (!detail::endpoint_answers_size_options(fi_version())) return;
  std::size_t max_rma = 0;
  std::size_t length = sizeof max_rma;
  if (fi_getopt(&endpoint_.get()->fid, FI_OPT_ENDPOINT, detail::endpoint_option::max_rma_size, &max_rma, &length) ==
          0 &&
      max_rma != 0) {
    info_.max_rma_size = max_rma;
    if (fi_info_->ep_attr->max_msg_size == 0 || fi_info_->ep_attr->max_msg_size > max_rma) {
      fi_info_->ep_attr->max_msg_size = max_rma;
    }
    info_.max_msg_size = fi_info_->ep_attr->max_msg_size;
  }
  if (std::string_view(info_.provider).rfind("efa", 0) != 0) return;
  bool emulated = false;
  length = sizeof emulated;
  if (fi_getopt(&endpoint_.get()->fid, FI_OPT_ENDPOINT, detail::endpoint_option::efa_emulated_write, &emulated,
                &length) == 0) {
    info_.rma_emulated = emulated;
  }
}

detail::Fid<fid_ep> Endpoint::open_endpoint(std::error_code& ec) {
  detail::Fid<fid_ep> ep;
  auto check = [&](int code, const char* step) {
    if (code != 0) {
      ec = fabric_error(code);
      failed_step_ = step;
    }
    return !ec;
  };
  if (!check(fi_endpoint(domain_.get(), fi_info_.get(), ep.out(), nullptr), "fi_endpoint")) return {};
  if (!check(fi_ep_bind(ep.get(), &av_.get()->fid, 0), "fi_ep_bind(av)")) return {};
  if (!check(fi_ep_bind(ep.get(), &cq_.get()->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)")) return {};
  if (rnr_retry_) {
    // efa takes it only before fi_enable, when it creates the queue pair.
    const std::size_t retry = *rnr_retry_;
    if (!check(fi_setopt(&ep.get()->fid, FI_OPT_ENDPOINT, detail::endpoint_option::efa_rnr_retry, &retry, sizeof retry),
               "fi_setopt(FI_OPT_EFA_RNR_RETRY)")) {
      return {};
    }
  }
  if (!check(fi_enable(ep.get()), "fi_enable")) return {};
  return ep;
}

Endpoint::Retired Endpoint::replace_endpoint(std::error_code& ec) {
  ec.clear();
  if (!domain_ || !cq_ || !av_) {
    ec = errc::not_open;
    return {};
  }
  Retired old{std::move(endpoint_), std::move(cq_)};
  const int old_fd = wait_fd_;
  const auto old_address = local_address_;
  auto restore = [&] {
    endpoint_ = std::move(old.endpoint);
    cq_ = std::move(old.cq);
    wait_fd_ = old_fd;
    local_address_ = old_address;
  };
  const detail::Log log(log_handler_);
  fi_cq_attr attr = cq_attributes(cq_format_, info_.cq_size, cq_wait_object_);
  if (int code = fi_cq_open(domain_.get(), &attr, cq_.out(), nullptr); code != 0) {
    ec = fabric_error(code);
    failed_step_ = "fi_cq_open";
    restore();
    log(LogLevel::warning, [&] { return "endpoint not replaced: fi_cq_open: " + ec.message(); });
    return {};
  }
  read_wait_fd();
  endpoint_ = open_endpoint(ec);
  if (!ec) read_local_address(ec);
  if (ec) {
    endpoint_.reset();
    cq_.reset();
    restore();
    log(LogLevel::warning, [&] { return "endpoint not replaced: " + failed_step_ + ": " + ec.message(); });
    return {};
  }
  log(LogLevel::info,
      [&] { return "endpoint replaced: address " + encode_hex(old_address) + " -> " + encode_hex(local_address_); });
  return old;
}

void Endpoint::read_wait_fd() noexcept {
  wait_fd_ = -1;
  if (cq_wait_object_ != FI_WAIT_FD) return;
  int fd = -1;
  if (fi_control(&cq_.get()->fid, FI_GETWAIT, &fd) == 0 && fd >= 0) wait_fd_ = fd;
}

void Endpoint::open_cq(const Configuration& configuration, std::error_code& ec) {
  const std::size_t wanted_credits = requested_in_flight(configuration, info_.tx_size);
  // Room for many peers' credits: a peer that stops answering holds its credits until their
  // deadline, and the others post meanwhile.
  fi_cq_attr attr = cq_attributes(
      cq_format_, configuration.cq_size != 0 ? configuration.cq_size : std::max<std::size_t>(1024, 2 * wanted_credits),
      detail::read_answer(*fi_info_, configuration, fi_version()).cq_wait);
  int code = fi_cq_open(domain_.get(), &attr, cq_.out(), nullptr);
  if (code != 0 && attr.wait_obj == FI_WAIT_FD) {
    // shm and efa-with-shm refuse an fd; the service then polls on its executor.
    attr.wait_obj = FI_WAIT_NONE;
    code = fi_cq_open(domain_.get(), &attr, cq_.out(), nullptr);
  }
  if (code != 0) {
    ec = fabric_error(code);
    failed_step_ = "fi_cq_open";
    return;
  }
  info_.cq_size = attr.size;
  info_.credits = std::min(wanted_credits, info_.cq_size);
  info_.in_flight_limit = info_.tx_size == 0 ? info_.cq_size : std::min(info_.tx_size, info_.cq_size);
  cq_wait_object_ = attr.wait_obj;
  read_wait_fd();
  info_.wait_fd = wait_fd_ >= 0;
}

void Endpoint::read_local_address(std::error_code& ec) {
  std::size_t length = 0;
  (void)fi_getname(&endpoint_.get()->fid, nullptr, &length);  // -FI_ETOOSMALL, with the size
  if (length == 0) {
    ec = fabric_error(-FI_EADDRNOTAVAIL);
    failed_step_ = "fi_getname returned zero length";
    return;
  }
  local_address_.resize(length);
  if (int code = fi_getname(&endpoint_.get()->fid, local_address_.data(), &length); code != 0) {
    ec = fabric_error(code);
    failed_step_ = "fi_getname";
    return;
  }
  local_address_.resize(length);
}

EndpointInfo Endpoint::describe() const { return info_; }

fi_addr_t Endpoint::insert_address(std::span<const std::uint8_t> address, std::error_code& ec) noexcept {
  fi_addr_t handle = FI_ADDR_NOTAVAIL;
  const int inserted = fi_av_insert(av_.get(), address.data(), 1, &handle, 0, nullptr);
  if (inserted < 0) {
    ec = fabric_error(inserted);
  } else if (inserted != 1) {
    ec = errc::av_insert_failed;
  }
  return handle;
}

int Endpoint::remove_address(fi_addr_t handle) noexcept {
  const int code = fi_av_remove(av_.get(), &handle, 1, 0);
  if (code != 0) {
    const detail::Log log(log_handler_);
    log(LogLevel::warning, [&] {
      return "fi_av_remove failed: " + std::string(fi_strerror(code < 0 ? -code : code)) + " (" + std::to_string(code) +
             ") for address-vector entry " + std::to_string(handle) +
             "; the entry stays until the address vector closes";
    });
  }
  return code;
}

detail::Fid<fid_mr> Endpoint::register_memory(const void* base, std::size_t length, std::uint64_t access,
                                              std::uint64_t requested_key, std::error_code& ec) noexcept {
  detail::Fid<fid_mr> mr;
  const int code = fi_mr_reg(domain_.get(), base, length, access, 0, requested_key, 0, mr.out(), nullptr);
  if (code != 0) ec = fabric_error(code);
  return mr;
}

}  // namespace dma
