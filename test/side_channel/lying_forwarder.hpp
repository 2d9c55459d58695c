// A fabric endpoint that lies: a forwarder between dma-kv-server and a real dma::Target that passes
// the tcp provider's frames through, except that it cuts the data of every RMA read response to at
// most `keep` bytes and fixes the frame's size to match, so the stream stays in step and the server
// sees a short read. The frame layout it relies on is libfabric's tcp wire protocol version 3
// (docs/notes/lying-endpoint.md); on any other it passes bytes through untouched and says so.
#pragma once

#include "../catch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

namespace side_channel_test {

class LyingForwarder {
 public:
  /// Forwards to the tcp fabric address `target` (a sockaddr_in on 127.0.0.1).
  explicit LyingForwarder(const sockaddr_in& target) : target_(target) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener_ >= 0);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&any), sizeof any) == 0);
    REQUIRE(::listen(listener_, 16) == 0);
    socklen_t length = sizeof address_;
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&address_), &length) == 0);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~LyingForwarder() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard lock(mutex_);
    for (auto& t : relays_)
      t.join();
    for (const int fd : fds_)
      ::close(fd);
    ::close(listener_);
  }
  LyingForwarder(const LyingForwarder&) = delete;
  LyingForwarder& operator=(const LyingForwarder&) = delete;

  /// The forwarder's own address, to name in DMA.HELLO.
  const sockaddr_in& address() const { return address_; }
  /// Read responses carry at most this many data bytes from now on (-1: all of them).
  void keep(long bytes) { keep_ = bytes; }
  /// Read responses cut so far.
  int cut() const { return cut_; }
  /// True when a frame did not look like tcp wire protocol version 3.
  bool unknown_protocol() const { return unknown_; }

 private:
  static constexpr std::size_t ctrl_header = 32;  // struct ofi_ctrl_hdr
  static constexpr std::size_t base_header = 16;  // struct tcpx_base_hdr (1.17), xnet_base_hdr (2.x)
  static constexpr std::uint8_t wire_version = 3;
  static constexpr std::uint8_t op_read_response = 3;  // ofi_op_read_rsp

  // Waits until fd is readable or the forwarder stops; false on stop.
  bool wait_readable(int fd) {
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      const int n = ::poll(&p, 1, 50);
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return false;
    }
    return false;
  }
  bool read_exact(int fd, std::uint8_t* data, std::size_t n) {
    while (n > 0) {
      if (!wait_readable(fd)) return false;
      const ssize_t got = ::recv(fd, data, n, 0);
      if (got <= 0) return false;
      data += got;
      n -= static_cast<std::size_t>(got);
    }
    return true;
  }
  static bool write_all(int fd, const std::uint8_t* data, std::size_t n) {
    while (n > 0) {
      const ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL);
      if (sent <= 0) return false;
      data += sent;
      n -= static_cast<std::size_t>(sent);
    }
    return true;
  }
  // Copies n bytes from one socket to the other (or drops them when to < 0).
  bool pass(int from, int to, std::uint64_t n) {
    std::array<std::uint8_t, 65536> chunk;
    while (n > 0) {
      const std::size_t step = static_cast<std::size_t>(std::min<std::uint64_t>(n, chunk.size()));
      if (!read_exact(from, chunk.data(), step)) return false;
      if (to >= 0 && !write_all(to, chunk.data(), step)) return false;
      n -= step;
    }
    return true;
  }
  void raw(int from, int to) {
    std::array<std::uint8_t, 65536> chunk;
    while (wait_readable(from)) {
      const ssize_t got = ::recv(from, chunk.data(), chunk.size(), 0);
      if (got <= 0 || !write_all(to, chunk.data(), static_cast<std::size_t>(got))) break;
    }
    ::shutdown(to, SHUT_WR);
  }
  // Target to server: the connection response, then frames.
  void lie(int from, int to) {
    // The connection response goes on in one piece: the provider reads its header and data with
    // one non-blocking recv each, and fails the connection if the data is not there yet.
    std::vector<std::uint8_t> response(ctrl_header);
    if (!read_exact(from, response.data(), ctrl_header)) return;
    if (response[0] != wire_version) {
      unknown_ = true;
      write_all(to, response.data(), ctrl_header);
      return raw(from, to);
    }
    std::uint16_t cm_data = 0;
    std::memcpy(&cm_data, &response[2], 2);
    response.resize(ctrl_header + ntohs(cm_data));
    if (!read_exact(from, response.data() + ctrl_header, response.size() - ctrl_header) ||
        !write_all(to, response.data(), response.size()))
      return;
    for (;;) {
      std::array<std::uint8_t, 256> header;
      if (!read_exact(from, header.data(), base_header)) break;
      const std::uint8_t header_size = header[6];
      std::uint64_t size = 0;
      std::memcpy(&size, &header[8], 8);  // host order: both ends are this host
      if (header[0] != wire_version || header_size < base_header || size < header_size) {
        unknown_ = true;
        write_all(to, header.data(), base_header);
        return raw(from, to);
      }
      if (!read_exact(from, header.data() + base_header, header_size - base_header)) break;
      const std::uint64_t data = size - header_size;
      const long keep = keep_;
      std::uint64_t forwarded = data;
      if (header[1] == op_read_response && keep >= 0 && data > static_cast<std::uint64_t>(keep)) {
        forwarded = static_cast<std::uint64_t>(keep);
        const std::uint64_t cut_size = header_size + forwarded;
        std::memcpy(&header[8], &cut_size, 8);
        ++cut_;
      }
      if (!write_all(to, header.data(), header_size) || !pass(from, to, forwarded) || !pass(from, -1, data - forwarded))
        break;
    }
    ::shutdown(to, SHUT_WR);
  }
  void accept_loop() {
    while (wait_readable(listener_)) {
      const int server = ::accept(listener_, nullptr, nullptr);
      if (server < 0) continue;
      const int target = ::socket(AF_INET, SOCK_STREAM, 0);
      if (::connect(target, reinterpret_cast<const sockaddr*>(&target_), sizeof target_) != 0) {
        ::close(server);
        ::close(target);
        continue;
      }
      std::lock_guard lock(mutex_);
      fds_.push_back(server);
      fds_.push_back(target);
      relays_.emplace_back([this, server, target] { raw(server, target); });
      relays_.emplace_back([this, server, target] { lie(target, server); });
    }
  }

  sockaddr_in target_;
  sockaddr_in address_{};
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<long> keep_{-1};
  std::atomic<int> cut_{0};
  std::atomic<bool> unknown_{false};
  std::mutex mutex_;
  std::list<std::thread> relays_;
  std::vector<int> fds_;
  std::thread acceptor_;
};

}  // namespace side_channel_test
