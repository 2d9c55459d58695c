#include "connection_cut.hpp"

#include <rdma/fabric.h>

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dma::detail {

bool closing_frees_reads_twice(Provider provider) noexcept {
  const auto version = fi_version();
  return provider == Provider::tcp && FI_MAJOR(version) == 1 && FI_MINOR(version) < 18;
}

namespace {

// The inode of the socket that /proc/self/fd/<fd> links to ("socket:[12345]"), or 0. Reading the
// link never touches the descriptor, which another thread (a Target's progress, say) may be closing
// at that moment.
std::uint64_t socket_inode(int fd) noexcept {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  char link[64];
  const ssize_t length = ::readlink(path, link, sizeof link - 1);
  if (length <= 0) return 0;
  link[length] = '\0';
  constexpr char prefix[] = "socket:[";
  if (std::strncmp(link, prefix, sizeof prefix - 1) != 0) return 0;
  char* end = nullptr;
  const unsigned long long inode = std::strtoull(link + sizeof prefix - 1, &end, 10);
  return end != nullptr && *end == ']' ? static_cast<std::uint64_t>(inode) : 0;
}

// Calls f(fd, inode) for each open socket of the process.
template <typename F>
void for_each_socket(F&& f) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int own = ::dirfd(dir);
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    const std::uint64_t inode = socket_inode(static_cast<int>(fd));
    if (inode != 0) f(static_cast<int>(fd), inode);
  }
  ::closedir(dir);
}

}  // namespace

std::vector<std::uint64_t> socket_inodes() {
  std::vector<std::uint64_t> inodes;
  for_each_socket([&](int, std::uint64_t inode) { inodes.push_back(inode); });
  std::sort(inodes.begin(), inodes.end());
  return inodes;
}

bool same_socket_address(const void* peer, std::size_t peer_length, std::span<const std::uint8_t> address) noexcept {
  if (peer_length < sizeof(sa_family_t)) return false;
  sockaddr_storage ours{};
  std::memcpy(&ours, address.data(), std::min(address.size(), sizeof ours));
  sockaddr_storage theirs{};
  std::memcpy(&theirs, peer, std::min(peer_length, sizeof theirs));
  if (ours.ss_family != theirs.ss_family) return false;
  if (theirs.ss_family == AF_INET) {
    if (address.size() < sizeof(sockaddr_in) || peer_length < sizeof(sockaddr_in)) return false;
    const auto& a = reinterpret_cast<const sockaddr_in&>(ours);
    const auto& b = reinterpret_cast<const sockaddr_in&>(theirs);
    return a.sin_port == b.sin_port && a.sin_addr.s_addr == b.sin_addr.s_addr;
  }
  if (theirs.ss_family == AF_INET6) {
    if (address.size() < sizeof(sockaddr_in6) || peer_length < sizeof(sockaddr_in6)) return false;
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ours);
    const auto& b = reinterpret_cast<const sockaddr_in6&>(theirs);
    return a.sin6_port == b.sin6_port && std::memcmp(&a.sin6_addr, &b.sin6_addr, sizeof a.sin6_addr) == 0;
  }
  return false;
}

std::size_t shut_down_connections(std::span<const std::uint64_t> sockets,
                                  std::span<const std::vector<std::uint8_t>> peers) noexcept {
  if (sockets.empty() || peers.empty()) return 0;
  std::size_t cut = 0;
  for_each_socket([&](int fd, std::uint64_t inode) {
    if (!std::binary_search(sockets.begin(), sockets.end(), inode)) return;
    sockaddr_storage peer{};
    socklen_t length = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return;
    const bool doomed = std::any_of(peers.begin(), peers.end(), [&](const std::vector<std::uint8_t>& address) {
      return same_socket_address(&peer, length, address);
    });
    if (!doomed) return;
    // The descriptor is looked up again just before the cut: had it been closed and its number
    // reused since the listing, the inode would differ.
    if (socket_inode(fd) != inode) return;
    if (::shutdown(fd, SHUT_RDWR) == 0) ++cut;
  });
  return cut;
}

}  // namespace dma::detail
