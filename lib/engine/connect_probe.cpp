#include "connect_probe.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dma::detail {

void ConnectProbe::start(std::span<const std::uint8_t> address) noexcept {
  if (fd_ >= 0) return;
  sockaddr_storage peer{};
  socklen_t length = 0;
  if (address.size() == sizeof(sockaddr_in) || address.size() == sizeof(sockaddr_in6)) {
    std::memcpy(&peer, address.data(), address.size());
    length = static_cast<socklen_t>(address.size());
  }
  const bool ip = (peer.ss_family == AF_INET && length == sizeof(sockaddr_in)) ||
                  (peer.ss_family == AF_INET6 && length == sizeof(sockaddr_in6));
  if (!ip) return;
  fd_ = ::socket(peer.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  if (::connect(fd_, reinterpret_cast<const sockaddr*>(&peer), length) == 0) return;  // finish() sees it
  if (errno == EINPROGRESS) return;
  // Refused at once (loopback): the answer is in already.
  answered_ = true;
  answer_ = errno == ECONNREFUSED ? Verdict::refused : Verdict::silent;
}

ConnectProbe::Verdict ConnectProbe::peek() noexcept {
  if (fd_ < 0) return Verdict::none;
  if (answered_) return answer_;
  pollfd p{fd_, POLLOUT, 0};
  if (::poll(&p, 1, 0) != 1) return Verdict::silent;
  answered_ = true;
  int error = 0;
  socklen_t size = sizeof error;
  if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &size) == 0) {
    if (error == 0) answer_ = Verdict::listening;
    if (error == ECONNREFUSED) answer_ = Verdict::refused;
  }
  return answer_;
}

ConnectProbe::Verdict ConnectProbe::finish() noexcept {
  const Verdict verdict = peek();
  reset();
  return verdict;
}

void ConnectProbe::reset() noexcept {
  answer_ = Verdict::silent;
  answered_ = false;
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
}

}  // namespace dma::detail
