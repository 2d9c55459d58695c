// Helpers for the side channel's process tests: child processes ended by their PID, a dma-kv-server
// on a free port, a blocking RESP connection, and /proc readings.
#pragma once

#include "../catch.hpp"

#include <dma/dma.hpp>
#include <dma/kv/resp.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace side_channel_test {

using namespace std::chrono_literals;

/// A program built next to the tests (Meson passes its path in the environment).
inline std::string program(const char* variable, const char* relative) {
  if (const char* path = std::getenv(variable)) return path;
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string("test/side_channel/x");
  return dir.substr(0, dir.rfind('/')) + "/../../examples/side_channel/" + relative;
}
inline std::string server_program() { return program("DMA_KV_SERVER", "dma-kv-server"); }
inline std::string client_program() { return program("DMA_KV_CLIENT", "dma-kv-client"); }

/// A test's own Target: tcp on 127.0.0.1, like the server it talks to.
inline dma::Configuration loopback_configuration() {
  dma::Configuration c;
  c.bind = "127.0.0.1";
  return c;
}

/// Whether a program is on PATH.
inline bool on_path(const std::string& name) {
  std::stringstream in(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin");
  for (std::string dir; std::getline(in, dir, ':');) {
    if (access((dir + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

/// One child process with its stdout on a pipe (stderr inherited); killed by PID on destruction.
class Child {
 public:
  explicit Child(std::vector<std::string> arguments) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<char*> argv;
    for (auto& a : arguments)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_ = fds[0];
    INFO("starting " << arguments[0]);
    REQUIRE(rc == 0);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    kill_now();
    close(out_);
  }

  pid_t pid() const noexcept { return pid_; }
  void signal(int number) {
    if (pid_ > 0) ::kill(pid_, number);
  }
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  /// The next line of stdout, or "" when none arrives within the bound.
  std::string line(std::chrono::milliseconds bound = 20s) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (;;) {
      if (auto at = buffer_.find('\n'); at != std::string::npos) {
        std::string result = buffer_.substr(0, at);
        buffer_.erase(0, at + 1);
        return result;
      }
      if (!fill(deadline)) return {};
    }
  }
  /// Everything the child writes until it closes stdout (or the bound passes).
  std::string rest(std::chrono::milliseconds bound = 60s) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (fill(deadline)) {
    }
    return std::exchange(buffer_, {});
  }

  /// The exit status (128 + signal when killed), or -1 if it does not exit within the bound.
  int wait(std::chrono::milliseconds bound = 60s) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(5ms);
    }
    return -1;
  }

 private:
  bool fill(std::chrono::steady_clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char chunk[4096];
    const ssize_t n = read(out_, chunk, sizeof chunk);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
};

/// A dma-kv-server on a free loopback port.
class Server {
 public:
  explicit Server(std::vector<std::string> extra = {}) : child_(arguments(std::move(extra))) {
    const std::string first = child_.line();
    const std::string prefix = "listening on 127.0.0.1:";
    INFO("dma-kv-server printed: " << first);
    REQUIRE(first.rfind(prefix, 0) == 0);
    port_ = static_cast<std::uint16_t>(std::stoul(first.substr(prefix.size())));
  }
  std::uint16_t port() const noexcept { return port_; }
  std::string port_text() const { return std::to_string(port_); }
  pid_t pid() const noexcept { return child_.pid(); }
  Child& child() noexcept { return child_; }

 private:
  static std::vector<std::string> arguments(std::vector<std::string> extra) {
    std::vector<std::string> all{server_program(), "--port", "0"};
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  }
  Child child_;
  std::uint16_t port_ = 0;
};

/// A blocking RESP connection for driving the server by hand. Every read is bounded in time.
class Resp {
 public:
  explicit Resp(std::uint16_t port) : socket_(io_) {
    socket_.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  }
  void send_raw(std::string_view bytes) { asio::write(socket_, asio::buffer(bytes)); }
  /// Sends what the server takes before it closes the connection; false when it closed first.
  bool send_until_closed(std::string_view bytes) {
    std::error_code ec;
    asio::write(socket_, asio::buffer(bytes), ec);
    return !ec;
  }
  /// The next reply, or none when the server closes (or resets) the connection first.
  std::optional<dma::kv::resp::Reply> reply_or_close() {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    dma::kv::resp::Limits limits;
    while (std::chrono::steady_clock::now() < deadline) {
      dma::kv::resp::Reply r;
      if (dma::kv::resp::parse_reply(buffer_, limits, r).status == dma::kv::resp::Status::complete) return reply();
      if (!read_some(deadline)) return std::nullopt;
    }
    FAIL("no reply and no close within 20 s");
    return std::nullopt;
  }
  /// Sends a multibulk command and returns its reply (strings copied out).
  dma::kv::resp::Reply command(std::vector<std::string> arguments) {
    std::vector<std::string_view> views(arguments.begin(), arguments.end());
    std::string out;
    dma::kv::resp::encode_command(out, views);
    send_raw(out);
    return reply();
  }
  /// Reads one reply; fails the test if none arrives within 20 s.
  dma::kv::resp::Reply reply() {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    dma::kv::resp::Limits limits;
    for (;;) {
      dma::kv::resp::Reply r;
      const auto parsed = dma::kv::resp::parse_reply(buffer_, limits, r);
      if (parsed.status == dma::kv::resp::Status::complete) {
        held_ = buffer_.substr(0, parsed.consumed);
        buffer_.erase(0, parsed.consumed);
        dma::kv::resp::Reply copy;
        dma::kv::resp::parse_reply(held_, limits, copy);
        return copy;
      }
      REQUIRE(parsed.status == dma::kv::resp::Status::incomplete);
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      if (!read_some(deadline)) {
        FAIL("the connection closed without a reply");
      }
    }
  }
  /// True when the server closes the connection within the bound.
  bool closed_by_peer(std::chrono::milliseconds bound = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!read_some(deadline)) return true;
    }
    return false;
  }
  void close() {
    std::error_code ignored;
    socket_.close(ignored);
  }

 private:
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{socket_.native_handle(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<long>(left.count(), 0))) <= 0) return true;  // timeout: still open
    char chunk[65536];
    std::error_code ec;
    const std::size_t n = socket_.read_some(asio::buffer(chunk), ec);
    if (ec) return false;
    buffer_.append(chunk, n);
    return true;
  }

  asio::io_context io_;
  asio::ip::tcp::socket socket_;
  std::string buffer_;
  std::string held_;  // the bytes the last reply's strings view
};

/// The value of `field:value` among the lines of an INFO-style text, or "" when absent.
inline std::string field_of(std::string_view text, const std::string& field) {
  std::stringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind(field + ":", 0) == 0) return line.substr(field.size() + 1);
  }
  return {};
}
/// `field:value` from the server's DMA.INFO over an open connection, or "" when absent.
inline std::string info_field(Resp& resp, const std::string& field) {
  return field_of(resp.command({"DMA.INFO"}).text, field);
}
inline std::string info_field(std::uint16_t port, const std::string& field) {
  Resp resp(port);
  return info_field(resp, field);
}
/// A DMA.INFO number over an open connection (no assertion: for tight polling loops).
inline std::uint64_t info_value(Resp& resp, const std::string& field) {
  const auto text = info_field(resp, field);
  return text.empty() ? 0 : std::stoull(text);
}
inline std::uint64_t info_number(std::uint16_t port, const std::string& field) {
  const auto text = info_field(port, field);
  INFO("DMA.INFO field " << field << " = '" << text << "'");
  REQUIRE(!text.empty());
  return std::stoull(text);
}

/// Waits (bounded) until a DMA.INFO number equals `value`; returns the last reading.
inline std::uint64_t wait_for_info(std::uint16_t port, const std::string& field, std::uint64_t value,
                                   std::chrono::milliseconds bound = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  std::uint64_t now = info_number(port, field);
  while (now != value && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    now = info_number(port, field);
  }
  return now;
}

inline std::size_t fd_count(pid_t pid) {
  std::size_t n = 0;
  if (DIR* dir = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (dirent* entry = readdir(dir))
      n += entry->d_name[0] != '.';
    closedir(dir);
  }
  return n;
}

/// For `socket:[inode]`, the TCP socket's local and remote ends and state from /proc/<pid>/net/tcp.
inline std::string socket_ends(pid_t pid, const std::string& target) {
  if (target.rfind("socket:[", 0) != 0) return {};
  const std::string inode = target.substr(8, target.size() - 9);
  std::ifstream in("/proc/" + std::to_string(pid) + "/net/tcp");
  for (std::string line; std::getline(in, line);) {
    std::stringstream fields(line);
    std::vector<std::string> f;
    for (std::string field; fields >> field;)
      f.push_back(field);
    if (f.size() > 9 && f[9] == inode) return " tcp " + f[1] + " -> " + f[2] + " state " + f[3];
  }
  return {};
}

/// What each of a process's fds refers to, one `fd -> target` per line (for failure messages).
inline std::string fd_targets(pid_t pid) {
  std::string out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* entry = readdir(d)) {
      if (entry->d_name[0] == '.') continue;
      char target[256] = {};
      const ssize_t n = readlink((dir + "/" + entry->d_name).c_str(), target, sizeof target - 1);
      const std::string what = n > 0 ? std::string(target, static_cast<std::size_t>(n)) : "?";
      out += std::string(entry->d_name) + " -> " + what + socket_ends(pid, what) + "\n";
    }
    closedir(d);
  }
  return out;
}

inline std::size_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  }
  return 0;
}

/// The value of `"key": <number>` in the first JSON object of `arm` in bench's --json output.
inline double json_number(const std::string& json, const std::string& arm, const std::string& key) {
  const auto at = json.find("\"arm\": \"" + arm + "\"");
  if (at == std::string::npos) return -1;
  const auto field = json.find("\"" + key + "\": ", at);
  if (field == std::string::npos) return -1;
  return std::stod(json.substr(field + key.size() + 4));
}

/// Reads a `bench --json` child to its end under notification confirmation, and checks it: exit 0,
/// no error or mismatch, and every GET read after its notification (with sizes from 1 B no value is
/// empty, so each is written). Returns how many GETs it made.
inline double require_notified_bench(Child& bench) {
  const auto json = bench.rest(120s);
  INFO("bench printed: " << json);
  CHECK(bench.wait(20s) == 0);
  CHECK(json_number(json, "dma", "errors") == 0);
  CHECK(json_number(json, "dma", "mismatches") == 0);
  const auto gets = json_number(json, "dma", "gets");
  CHECK(gets > 0);
  CHECK(json_number(json, "dma", "notified") == gets);
  return gets;
}

}  // namespace side_channel_test
