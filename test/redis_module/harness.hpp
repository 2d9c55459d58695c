// The module suites' harness: redis-server 7.0 (Debian's), or the program named by
// DMA_MODULE_SERVER (CI points it at a Valkey 8.1 built from ../shared/valkey/), started with the
// module loaded on a free loopback port and stopped by its PID; a peer with one buffer in the test
// process; and dma-kv-client runs.
#pragma once

#include "process.hpp"

#include "pattern.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <filesystem>
#include <random>

namespace module_test {

using namespace side_channel_test;

inline std::string module_server_program() {
  const char* path = std::getenv("DMA_MODULE_SERVER");
  return path != nullptr && *path != '\0' ? path : "redis-server";
}
// Absolute: the server changes into its --dir before it loads the module.
inline std::string module_path() {
  return std::filesystem::absolute(program("DMA_MODULE", "../redis_module/dma-module.so")).string();
}

inline bool runnable(const std::string& name) {
  return name.find('/') != std::string::npos ? access(name.c_str(), X_OK) == 0 : on_path(name);
}

inline std::uint16_t free_port() {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  return acceptor.local_endpoint().port();
}

inline bool bindable(std::uint16_t port) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io);
  std::error_code ec;
  acceptor.open(asio::ip::tcp::v4(), ec);
  if (!ec) acceptor.bind(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  return !ec;
}

/// A port for a cluster node: below the ephemeral range, with its cluster bus port (the port +
/// 10000) free too.
inline std::uint16_t free_cluster_port() {
  static std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 500; ++attempt) {
    const auto port = static_cast<std::uint16_t>(std::uniform_int_distribution<int>(20000, 29999)(random));
    if (bindable(port) && bindable(static_cast<std::uint16_t>(port + 10000))) return port;
  }
  return free_port();  // the start then fails and says so
}

inline bool answers_ping(std::uint16_t port) {
  try {
    Resp resp(port);
    resp.send_raw("PING\r\n");
    const auto reply = resp.reply_or_close();
    return reply && reply->text == "PONG";
  } catch (const std::system_error&) {
    return false;
  }
}

// A scratch folder, removed with everything in it when it goes (also when a constructor that
// holds one fails).
class Scratch {
 public:
  Scratch() {
    char path[] = "/tmp/dma-module-test-XXXXXX";
    REQUIRE(mkdtemp(path) != nullptr);
    path_ = path;
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// redis-server (or Valkey) with the module loaded, on a free loopback port, with its files in a
// scratch folder. Killed by its PID at the end unless it has exited.
class ModuleServer {
 public:
  explicit ModuleServer(std::vector<std::string> server_options = {}, std::vector<std::string> module_options = {},
                        std::uint16_t (*choose_port)() = free_port)
      : dir_(scratch_.path()) {
    for (int attempt = 0; attempt < 5 && !child_; ++attempt) {
      port_ = choose_port();
      std::vector<std::string> arguments{module_server_program(),
                                         "--port",
                                         std::to_string(port_),
                                         "--bind",
                                         "127.0.0.1",
                                         "--dir",
                                         dir_,
                                         "--logfile",
                                         dir_ + "/server.log",
                                         "--save",
                                         "",
                                         "--appendonly",
                                         "no",
                                         "--enable-module-command",
                                         "local",
                                         "--enable-debug-command",
                                         "local"};
      arguments.insert(arguments.end(), server_options.begin(), server_options.end());
      arguments.push_back("--loadmodule");
      arguments.push_back(module_path());
      arguments.insert(arguments.end(), module_options.begin(), module_options.end());
      child_.emplace(arguments);
      bool ready = false;
      for (int i = 0; i < 500 && !ready; ++i) {  // 10 s
        if (child_->wait(20ms) != -1) break;     // exited: the port was taken, or the load failed
        ready = answers_ping(port_);
      }
      if (!ready) child_.reset();
    }
    INFO("server log:\n" << log());
    REQUIRE(child_);
  }
  ~ModuleServer() { child_.reset(); }
  ModuleServer(const ModuleServer&) = delete;
  ModuleServer& operator=(const ModuleServer&) = delete;

  std::uint16_t port() const noexcept { return port_; }
  std::string port_text() const { return std::to_string(port_); }
  /// The server's --dir: its RDB and AOF files.
  const std::string& dir() const noexcept { return dir_; }
  Child& child() { return *child_; }
  std::string log() const {
    std::ifstream in(dir_ + "/server.log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  Scratch scratch_;
  std::string dir_;
  std::uint16_t port_ = 0;
  std::optional<Child> child_;
};

// A field of the server's own INFO.
inline std::string server_info(Resp& resp, const std::string& field) {
  return field_of(resp.command({"INFO"}).text, field);
}

// A peer in the test process with one buffer (a TargetThread). Made paused, its progress runs only
// once resume() is called, so a transfer to it stays in flight until then.
class Peer {
 public:
  explicit Peer(std::size_t size, bool running = true)
      : thread_(dma::TargetThread::start(loopback_configuration())), memory_(size) {
    region_ = thread_->expose(memory_);
    if (!running) thread_->pause();
  }
  void resume() { thread_->resume(); }
  std::string address_hex() const { return dma::encode_hex(thread_->target().local_address()); }
  std::string rkey() const { return std::to_string(region_.advertisement().remote_key); }
  std::string offset() const { return std::to_string(region_.advertisement().remote_address); }
  std::span<std::byte> memory() { return memory_; }
  std::vector<std::string> window(const char* command, const std::string& key, std::size_t length) const {
    return {command, key, rkey(), offset(), std::to_string(length)};
  }

 private:
  std::unique_ptr<dma::TargetThread> thread_;
  std::vector<std::byte> memory_;
  dma::Target::Region region_;
};

inline std::string encode(const std::vector<std::string>& arguments) {
  std::vector<std::string_view> views(arguments.begin(), arguments.end());
  std::string out;
  dma::kv::resp::encode_command(out, views);
  return out;
}

inline void require_ok(const dma::kv::resp::Reply& reply) {
  INFO("reply: " << reply.text);
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::simple);
  REQUIRE(reply.text == "OK");
}

inline void require_error(const dma::kv::resp::Reply& reply, std::string_view contains) {
  INFO("reply: " << reply.text);
  REQUIRE(reply.is_error());
  CHECK(reply.text.find(contains) != std::string_view::npos);
}

inline void hello(Resp& resp, const Peer& peer) {
  const auto reply = resp.command({"DMA.HELLO", peer.address_hex()});
  INFO("DMA.HELLO replied " << reply.text);
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
}

// redis-server 7.0 stores the very string the module sets, so the module can hold it and write a
// DMA.GET from it; Valkey 8.1 stores a copy (and names itself in INFO's server_name).
inline bool server_keeps_module_strings(Resp& resp) { return server_info(resp, "server_name").empty(); }

inline std::string pattern_text(const std::string& key, std::size_t length) {
  const kv::Pattern pattern(length);
  const auto bytes = pattern.value(kv::seed_of(key), length);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

inline std::vector<std::string> client(const ModuleServer& server, std::vector<std::string> arguments) {
  std::vector<std::string> all{client_program(), "--port", server.port_text()};
  all.insert(all.end(), arguments.begin(), arguments.end());
  return all;
}

// Runs dma-kv-client to its end; returns what it printed, requiring exit 0.
inline std::string run_client(const ModuleServer& server, std::vector<std::string> arguments) {
  Child run(client(server, std::move(arguments)));
  const std::string out = run.rest(60s);
  INFO("dma-kv-client printed: " << out);
  REQUIRE(run.wait(20s) == 0);
  return out;
}

// Waits (bounded) until a DMA.INFO number reaches `value`.
inline std::uint64_t wait_for(Resp& resp, const std::string& field, std::uint64_t value,
                              std::chrono::milliseconds bound = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  std::uint64_t now = info_value(resp, field);
  while (now != value && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    now = info_value(resp, field);
  }
  return now;
}

// Sends `setter`'s DMA.HELLO, then a DMA.SET of `peer`'s first `size` bytes without waiting for its
// reply, and waits until `admin`'s server has it in flight (a peer built not running holds it there).
inline void send_held_set(Resp& setter, Resp& admin, const Peer& peer, const std::string& key, std::size_t size) {
  hello(setter, peer);
  setter.send_raw(encode(peer.window("DMA.SET", key, size)));
  REQUIRE(wait_for(admin, "dma_sets_in_flight", 1) == 1);
}

// Waits (bounded) until a DMA.INFO number is above 0: transfers are under way.
inline bool wait_for_any(Resp& resp, const std::string& field, std::chrono::milliseconds bound = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (info_value(resp, field) == 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

inline std::vector<std::string> bench(std::vector<std::string> options) {
  std::vector<std::string> all{"bench", "--arms", "dma", "--json"};
  all.insert(all.end(), options.begin(), options.end());
  return all;
}

inline void require_clean_bench(Child& run) {
  const auto json = run.rest(120s);
  INFO("bench printed: " << json);
  CHECK(run.wait(20s) == 0);
  CHECK(json_number(json, "dma", "ops") > 0);
  CHECK(json_number(json, "dma", "errors") == 0);
  CHECK(json_number(json, "dma", "mismatches") == 0);
}

// A client that keeps moving 4 MiB values: after its first SET only DMA.GETs, or only DMA.SETs.
inline Child victim(const ModuleServer& server, bool gets) {
  return Child(client(server, bench({"--clients", "1", "--sizes", "4M", "--ratio", gets ? "1:0" : "0:1", "--duration",
                                     "30", "--keys", "1", "--key-prefix", gets ? "victim-get" : "victim-set"})));
}

/// The suites' main: runs Catch's session, or skips (77) when the server program is missing.
inline int run_suite(int argc, char* argv[]) {
  const std::string server = module_server_program();
  if (!runnable(server)) {
    std::printf("%s not found: apt-get install redis-server, or point DMA_MODULE_SERVER at a server; skipped\n",
                server.c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

}  // namespace module_test
