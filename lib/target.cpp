#include "dma/target.hpp"

#include "dma/error.hpp"
#include "hints.hpp"

#include "completion_error.hpp"
#include "cq_watcher.hpp"
#include "log.hpp"

#include <asio/post.hpp>

#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <atomic>
#include <mutex>
#include <random>

namespace dma {
namespace {

std::uint64_t access_bits(Target::Access access) {
  switch (access) {
    case Target::Access::read:
      return FI_REMOTE_READ;
    case Target::Access::write:
      return FI_REMOTE_WRITE;
    case Target::Access::read_write:
      break;
  }
  return FI_REMOTE_READ | FI_REMOTE_WRITE;
}

std::uint64_t random_key() {
  static thread_local std::mt19937_64 engine{[] {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }()};
  return engine();
}

}  // namespace

// Everything libfabric is touched under `mutex` (the endpoint is FI_THREAD_DOMAIN): the progress
// handlers on the executor and expose/withdraw from any thread.
struct Target::State : std::enable_shared_from_this<State> {
  using Watcher = detail::CqWatcher<executor_type>;

  State(const executor_type& executor, const Configuration& configuration)
      : executor(executor),
        log(configuration.log_handler),
        watcher(executor, configuration, detail::WaitPolicy::WithoutFd::backstop) {
    watcher.set_log(log);
  }

  void start() {
    watcher.attach(endpoint.fabric(), endpoint.cq(), endpoint.wait_fd());
    asio::post(executor, [self = shared_from_this()] { self->on_cq_event(detail::CqEvent::wake); });
  }

  // A passive target sees no completions, so its only sign of traffic is the wait fd: a wake-up
  // (or fi_trywait saying work is pending) starts an adaptive spin. The spin matters to the
  // initiator as much as to the target: data arriving at a target that is still polling needs no
  // wake-up, and over loopback the initiator's sendmsg pays for each one.
  void on_cq_event(detail::CqEvent event) {
    std::lock_guard lock(mutex);
    if (stopped) return;
    watcher.accept(event);
    passes.fetch_add(1, std::memory_order_relaxed);
    drain();  // which is what moves tcp's manual progress
    watcher.arm_backstop(shared_from_this());
    if (watcher.wait(shared_from_this(), false) == detail::CqWaited::armed) drain();
  }

  // The target posts nothing of its own: its entries are read and dropped, errors logged (at the
  // 1st, 2nd, 4th, … one: a misbehaving initiator may cause many).
  struct Sink {
    State& state;
    void completed(void*, detail::DrainPlace) noexcept {}
    void first_done() noexcept {}
    int failed(fid_cq* cq, const fi_cq_err_entry& entry) noexcept {
      if (!detail::log_occurrence(++state.errors)) return 0;
      state.log(LogLevel::warning, [&] {
        return "target completion error: " + detail::error_detail(cq, entry, true) + "; " +
               std::to_string(state.errors) + " so far";
      });
      return 0;
    }
  };
  void drain() {
    Sink sink{*this};
    (void)watcher.drain(endpoint.cq(), sink);
  }

  void stop() {
    std::lock_guard lock(mutex);
    stopped = true;
    watcher.close();
  }

  executor_type executor;
  std::mutex mutex;
  Endpoint endpoint;
  detail::Log log;
  Watcher watcher;
  std::uint64_t errors = 0;
  bool stopped = false;
  std::atomic<std::uint64_t> passes{0};
};

Target::Target(const executor_type& executor, const Configuration& configuration)
    : state_(std::make_shared<State>(executor, configuration)) {
  state_->endpoint.open(configuration);
  state_->start();
}

Target::~Target() {
  if (state_) state_->stop();
}

Target::Region Target::expose(std::span<std::byte> buffer, Access access) {
  std::error_code ec;
  Region region = expose(buffer, access, ec);
  if (ec) throw std::system_error(ec, "fi_mr_reg of " + std::to_string(buffer.size()) + " bytes for remote access");
  return region;
}

Target::Region Target::expose(std::span<std::byte> buffer, Access access, std::error_code& ec) {
  ec.clear();
  if (buffer.empty()) {
    ec = errc::zero_length_region;
    return {};
  }
  std::lock_guard lock(state_->mutex);
  Endpoint& endpoint = state_->endpoint;
  const bool provider_keys = (endpoint.describe().mr_mode & FI_MR_PROV_KEY) != 0;
  detail::Fid<fid_mr> mr;
  // Random keys make a guessed rkey useless; a duplicate (-FI_ENOKEY) just draws again.
  for (int attempt = 0; attempt < 8; ++attempt) {
    ec.clear();
    mr = endpoint.register_memory(buffer.data(), buffer.size(), access_bits(access), provider_keys ? 0 : random_key(),
                                  ec);
    if (ec != fabric_error(-FI_ENOKEY)) break;
  }
  if (ec) return {};
  Region region;
  region.advertisement_.address = endpoint.local_address();
  region.advertisement_.remote_key = fi_mr_key(mr.get());
  region.advertisement_.remote_address =
      endpoint.uses_virtual_addressing() ? reinterpret_cast<std::uintptr_t>(buffer.data()) : 0;
  region.bytes_ = buffer;
  region.mr_ = mr.release();
  region.state_ = state_;
  return region;
}

void Target::insert_initiator(std::span<const std::uint8_t> address) {
  std::error_code ec;
  insert_initiator(address, ec);
  throw_if(ec, "inserting the initiator's " + std::to_string(address.size()) + "-byte address");
}

void Target::insert_initiator(std::span<const std::uint8_t> address, std::error_code& ec) {
  ec = validate_address(address, state_->endpoint.addr_format());
  if (ec) return;
  std::lock_guard lock(state_->mutex);
  (void)state_->endpoint.insert_address(address, ec);
}

std::span<const std::uint8_t> Target::local_address() const noexcept { return state_->endpoint.local_address(); }
EndpointInfo Target::describe() const { return state_->endpoint.describe(); }
Target::executor_type Target::get_executor() const noexcept { return state_->executor; }
std::uint64_t Target::progress_passes() const noexcept { return state_->passes.load(std::memory_order_relaxed); }

Target::Region::Region() noexcept = default;
Target::Region::Region(Region&& other) noexcept
    : state_(std::move(other.state_)),
      mr_(std::exchange(other.mr_, nullptr)),
      bytes_(other.bytes_),
      advertisement_(std::move(other.advertisement_)) {}

Target::Region& Target::Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    Region discard(std::move(*this));
    state_ = std::move(other.state_);
    mr_ = std::exchange(other.mr_, nullptr);
    bytes_ = other.bytes_;
    advertisement_ = std::move(other.advertisement_);
  }
  return *this;
}

Target::Region::~Region() {
  if (state_ == nullptr || mr_ == nullptr) return;
  std::lock_guard lock(state_->mutex);
  detail::Fid<fid_mr> closing(static_cast<fid_mr*>(mr_));
}

}  // namespace dma
