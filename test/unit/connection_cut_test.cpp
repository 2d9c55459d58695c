// Cutting a replaced endpoint's connections: only the sockets it held, only those to the named
// peers, and a cut socket reads end of stream.
#include "connection_cut.hpp"
#include "../catch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

using dma::detail::same_socket_address;
using dma::detail::shut_down_connections;
using dma::detail::socket_inodes;

namespace {

std::vector<std::uint8_t> bytes_of(const sockaddr_in& address) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&address);
  return {p, p + sizeof address};
}

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A listening socket on 127.0.0.1 and a free port.
struct Listener {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = loopback(0);
  Listener() {
    REQUIRE(fd >= 0);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    REQUIRE(::listen(fd, 4) == 0);
  }
  ~Listener() { ::close(fd); }
};

int connect_to(const sockaddr_in& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  return fd;
}

std::uint64_t inode_of(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  return st.st_ino;
}

// Whether a recv would return end of stream now (readable, nothing to read).
bool reads_end_of_stream(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) != 1) return false;
  char byte = 0;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) == 0;
}

}  // namespace

TEST_CASE("a socket address matches the fabric address with the same family, host and port", "[unit][cut]") {
  const sockaddr_in a = loopback(4000);
  CHECK(same_socket_address(&a, sizeof a, bytes_of(a)));
  CHECK_FALSE(same_socket_address(&a, sizeof a, bytes_of(loopback(4001))));
  sockaddr_in other_host = a;
  other_host.sin_addr.s_addr = htonl(0x7f000002);
  CHECK_FALSE(same_socket_address(&a, sizeof a, bytes_of(other_host)));
  sockaddr_in6 six{};
  six.sin6_family = AF_INET6;
  six.sin6_port = a.sin_port;
  CHECK_FALSE(same_socket_address(&six, sizeof six, bytes_of(a)));
  CHECK_FALSE(same_socket_address(&a, sizeof a, std::vector<std::uint8_t>(4)));
}

TEST_CASE("only the listed sockets connected to a doomed peer are shut down", "[unit][cut]") {
  Listener doomed;
  Listener healthy;
  const int old_to_doomed = connect_to(doomed.address);
  const int old_to_healthy = connect_to(healthy.address);
  const std::vector<std::uint64_t> held = socket_inodes();
  CHECK(std::binary_search(held.begin(), held.end(), inode_of(old_to_doomed)));
  const int new_to_doomed = connect_to(doomed.address);  // opened later: not the old endpoint's

  const std::vector<std::vector<std::uint8_t>> peers{bytes_of(doomed.address)};
  CHECK(shut_down_connections(held, peers) == 1);
  CHECK(reads_end_of_stream(old_to_doomed));
  CHECK_FALSE(reads_end_of_stream(old_to_healthy));
  CHECK_FALSE(reads_end_of_stream(new_to_doomed));
  CHECK(shut_down_connections({}, peers) == 0);
  CHECK(shut_down_connections(held, {}) == 0);
  for (int fd : {old_to_doomed, old_to_healthy, new_to_doomed})
    ::close(fd);
}
