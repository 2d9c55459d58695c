// Why a tcp connection is late: a plain TCP connect to the peer's address, beside libfabric's own.
// libfabric reports a refused or rejected connection only as posts that keep getting -FI_EAGAIN;
// the probe tells apart nothing listening, a host that does not answer, and a listener whose
// libfabric rejected the connection request (a different wire protocol). Never blocks.
#pragma once

#include <cstdint>
#include <span>

namespace dma::detail {

class ConnectProbe {
 public:
  /// What the probe found.
  enum class Verdict : std::uint8_t {
    none,       ///< no probe ran: not an IP address, or the socket could not be made
    listening,  ///< the TCP connection succeeded: something listens there
    refused,    ///< the TCP connection was refused: nothing listens at the address
    silent,     ///< no answer yet, or another error (host down, filtered)
  };

  ConnectProbe() = default;
  ConnectProbe(const ConnectProbe&) = delete;
  ConnectProbe& operator=(const ConnectProbe&) = delete;
  ~ConnectProbe() { reset(); }

  /// Starts a non-blocking connect to `address` (a sockaddr_in or sockaddr_in6, as tcp's
  /// fi_getname gives it) unless one is under way; anything else is ignored.
  void start(std::span<const std::uint8_t> address) noexcept;
  /// Whether a probe is under way.
  bool started() const noexcept { return fd_ >= 0; }
  /// The verdict so far, without waiting; ends the probe.
  Verdict finish() noexcept;
  /// The verdict so far, without waiting; the probe goes on (silent) or keeps its answer.
  Verdict peek() noexcept;
  /// Ends the probe, if any.
  void reset() noexcept;

 private:
  int fd_ = -1;
  Verdict answer_ = Verdict::silent;  ///< what the socket said (SO_ERROR reads only once)
  bool answered_ = false;
};

}  // namespace dma::detail
