/// @file
/// dma::Target: the passive peer. It registers buffers for remote access, produces the
/// Advertisement a server needs, inserts an initiator's address where the provider demands it
/// (efa-direct), and drives progress on its executor (tcp's progress is manual: a target nobody
/// progresses stalls every server writing to it).
#pragma once

#include <dma/advertisement.hpp>
#include <dma/config.hpp>
#include <dma/configuration.hpp>
#include <dma/endpoint.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/execution_context.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>
#include <type_traits>

namespace dma {

/// The passive peer: exposes buffers for the server to write into or read from, and drives the
/// progress that tcp needs on the target side. Every member may be called from any thread.
class Target {
  struct State;

 public:
  /// The executor progress runs on.
  using executor_type = asio::any_io_executor;

  /// What a peer may do to an exposed buffer.
  enum class Access {
    read,       ///< the server may read (FI_REMOTE_READ)
    write,      ///< the server may write (FI_REMOTE_WRITE)
    read_write  ///< both
  };

  /// One exposed buffer. Destroying it closes the registration: after that no peer can reach the
  /// buffer, and it may be freed. Move-only.
  class Region {
   public:
    /// An empty region: no registration.
    Region() noexcept;
    /// Takes over `other`'s registration; `other` becomes empty.
    Region(Region&& other) noexcept;
    /// Closes this region's registration, then takes over `other`'s.
    Region& operator=(Region&& other) noexcept;
    /// Closes the registration: from then on no peer can reach the buffer.
    ~Region();

    /// `<address-hex> <rkey> <remote-addr>` for this buffer on this target.
    const Advertisement& advertisement() const noexcept { return advertisement_; }
    /// The exposed buffer.
    std::span<std::byte> bytes() const noexcept { return bytes_; }
    /// False for an empty (default-constructed or moved-from) region.
    explicit operator bool() const noexcept { return state_ != nullptr; }

   private:
    friend class Target;
    std::shared_ptr<State> state_;
    void* mr_ = nullptr;
    std::span<std::byte> bytes_;
    Advertisement advertisement_;
  };

  /// Opens the endpoint and starts driving progress on executor. Throws std::system_error.
  /// configuration.wait_mode says how: `fd` waits on the CQ's wait fd between passes, `adaptive`
  /// (the default) keeps polling for spin_budget after each wake-up before it waits again (data
  /// that lands meanwhile needs no wake-up, which over loopback also saves the writer's CPU), and
  /// `busy_poll` never waits (a core per target). A backstop timer (backstop_interval) also ticks.
  Target(const executor_type& executor, const Configuration& configuration);
  /// As Target(context.get_executor(), configuration), e.g. with an asio::io_context.
  template <typename ExecutionContext>
  requires std::is_convertible_v<ExecutionContext&, asio::execution_context&> Target(ExecutionContext& context,
                                                                                     const Configuration& configuration)
      : Target(executor_type(context.get_executor()), configuration) {}
  /// Stops driving progress. Regions still alive keep the endpoint open until they go.
  ~Target();
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  /// Registers buffer for remote access with a random 64-bit requested key (where the provider
  /// lets the application choose keys) and returns its Region. The buffer must outlive the Region.
  /// Throws std::system_error (fi_mr_reg's error; an empty buffer is errc::zero_length_region).
  Region expose(std::span<std::byte> buffer, Access access = Access::read_write);
  /// As expose(buffer, access), reporting a failure through `ec` and returning an empty Region.
  Region expose(std::span<std::byte> buffer, Access access, std::error_code& ec);

  /// Inserts an initiator's address into this target's AV. efa-direct requires this before the
  /// initiator can reach any region; tcp does not need it.
  /// Throws std::system_error: an invalid address (condition::invalid_advertisement) or
  /// fi_av_insert's error.
  void insert_initiator(std::span<const std::uint8_t> address);
  /// As insert_initiator(address), reporting a failure through `ec`.
  void insert_initiator(std::span<const std::uint8_t> address, std::error_code& ec);

  /// The target's fi_getname bytes: the address its advertisements carry.
  std::span<const std::uint8_t> local_address() const noexcept;
  /// What the target's endpoint ended up with.
  EndpointInfo describe() const;
  /// The executor progress runs on; it must keep running while any region is advertised.
  executor_type get_executor() const noexcept;
  /// Progress passes run so far (wake-ups, adaptive polls and backstop timer ticks).
  std::uint64_t progress_passes() const noexcept;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dma
