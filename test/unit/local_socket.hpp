// A TCP socket on 127.0.0.1, at a port of the kernel's choice, for tests that need an address
// something listens on, or one nobody listens on.
#pragma once

#include "../catch.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace test {

/// Bound to 127.0.0.1 on a free port; listening or not. Holds the port while it lives.
struct LocalSocket {
  explicit LocalSocket(bool listening) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    if (listening) REQUIRE(::listen(fd, 4) == 0);
    bytes.resize(sizeof address);
    std::memcpy(bytes.data(), &address, sizeof address);
  }
  LocalSocket(const LocalSocket&) = delete;
  LocalSocket& operator=(const LocalSocket&) = delete;
  ~LocalSocket() { ::close(fd); }
  int fd = -1;
  std::vector<std::uint8_t> bytes;  ///< the sockaddr_in, as tcp's fi_getname gives it
};

}  // namespace test
