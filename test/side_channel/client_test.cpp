// dma::kv::Client and dma::kv::CallbackClient against dma-kv-server over tcp on 127.0.0.1, and
// against a scripted RESP server in this process for the replies a healthy server never sends:
// every client_error, deadlines, a server that goes mid-command, 100 pipelined commands.
#include "process.hpp"

#include <dma/kv/callback_client.hpp>
#include <dma/kv/client.hpp>
#include <dma/kv/protocol.hpp>
#include <dma/target_thread.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>

#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <numeric>

using namespace side_channel_test;
using dma::kv::client_error;

namespace {

constexpr auto bound = 60s;  // how long any one command may take here before the test fails

// An io_context on a thread of its own, for the clients under test.
class ClientThread {
 public:
  ClientThread() : work_(asio::make_work_guard(io_)) {
    thread_ = std::thread([this] { io_.run(); });
  }
  ~ClientThread() {
    work_.reset();
    thread_.join();
  }
  asio::io_context& io() { return io_; }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

// A command's (error, result), awaited with a bound.
template <typename Result>
struct Call {
  std::promise<std::pair<std::error_code, Result>> promise;
  std::future<std::pair<std::error_code, Result>> future = promise.get_future();
  auto handler() {
    return [this](std::error_code ec, Result r) { promise.set_value({ec, std::move(r)}); };
  }
  std::pair<std::error_code, Result> get() {
    REQUIRE(future.wait_for(bound) == std::future_status::ready);
    return future.get();
  }
};

std::error_code connect(dma::kv::Client& client, std::uint16_t port) {
  std::promise<std::error_code> done;
  client.async_connect("127.0.0.1", port, [&](std::error_code ec) { done.set_value(ec); });
  auto future = done.get_future();
  REQUIRE(future.wait_for(bound) == std::future_status::ready);
  return future.get();
}

std::pair<std::error_code, dma::kv::HelloResult> hello(dma::kv::Client& client) {
  Call<dma::kv::HelloResult> call;
  client.async_hello(call.handler());
  return call.get();
}

std::vector<std::byte> pattern(std::size_t size, unsigned seed) {
  std::vector<std::byte> bytes(size);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : bytes) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return bytes;
}

// A RESP server in this process that answers each request with what `script` returns: reply
// bytes, or nullopt to close the connection. A request it should never answer gets "" back.
class ScriptedServer {
 public:
  using Script = std::function<std::optional<std::string>(const std::vector<std::string>& request)>;

  explicit ScriptedServer(Script script)
      : script_(std::move(script)), acceptor_(io_, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedServer() {
    stopping_ = true;
    std::error_code ignored;
    {
      std::lock_guard lock(mutex_);
      if (socket_) socket_->shutdown(asio::ip::tcp::socket::shutdown_both, ignored);  // ends a read
    }
    // Ends a blocked accept; the acceptor closes only once the thread is done with it.
    asio::ip::tcp::socket poke(io_);
    poke.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_), ignored);
    thread_.join();
    acceptor_.close(ignored);
  }
  std::uint16_t port() const { return port_; }
  std::size_t requests() const { return requests_.load(); }

 private:
  void serve() {
    while (!stopping_) {
      auto socket = std::make_shared<asio::ip::tcp::socket>(io_);
      std::error_code ec;
      acceptor_.accept(*socket, ec);
      if (ec || stopping_) return;
      {
        std::lock_guard lock(mutex_);
        socket_ = socket;
      }
      std::string buffer;
      dma::kv::resp::Limits limits;
      std::vector<std::string_view> arguments;
      for (bool open = true; open && !stopping_;) {
        char chunk[65536];
        const std::size_t n = socket->read_some(asio::buffer(chunk), ec);
        if (ec) break;
        buffer.append(chunk, n);
        for (;;) {
          const auto parsed = dma::kv::resp::parse_request(buffer, limits, arguments);
          if (parsed.status != dma::kv::resp::Status::complete) break;
          std::vector<std::string> request(arguments.begin(), arguments.end());
          buffer.erase(0, parsed.consumed);
          ++requests_;
          const auto reply = script_(request);
          if (!reply) {
            open = false;
            break;
          }
          asio::write(*socket, asio::buffer(*reply), ec);
        }
      }
      std::lock_guard lock(mutex_);
      socket_->close(ec);
      socket_.reset();
    }
  }

  Script script_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  std::uint16_t port_ = acceptor_.local_endpoint().port();
  std::thread thread_;
  std::mutex mutex_;
  std::shared_ptr<asio::ip::tcp::socket> socket_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> requests_{0};
};

// A DMA.HELLO reply a scripted server gives: its "fabric address" is the client's own (tcp needs
// no insert), reply confirmation, a token.
std::string hello_reply(const std::vector<std::string>& request) {
  dma::kv::HelloReply reply;
  reply.server_address_hex = request.at(1);
  reply.client_id = 7;
  reply.max_value = 1 << 20;
  reply.token = std::string(32, 'a');
  std::string out;
  dma::kv::append_hello_reply(out, reply);
  return out;
}

std::string error_reply(const std::string& text) {
  std::string out;
  dma::kv::resp::append_error(out, text);
  return out;
}

struct Setup {
  std::unique_ptr<dma::TargetThread> target = dma::TargetThread::start(loopback_configuration());
  dma::kv::ClientTarget shared{target->target()};
  ClientThread thread;
};

}  // namespace

TEST_CASE("a 1 MiB value goes in and comes back byte-exact, from exposed regions and from plain spans", "[client]") {
  Server server;
  Setup s;
  dma::kv::Client client(s.thread.io(), s.shared);
  REQUIRE(connect(client, server.port()) == std::error_code());
  const auto [hello_ec, hello_result] = hello(client);
  INFO(hello_result.detail);
  REQUIRE(!hello_ec);
  CHECK(hello_result.reply.token.size() == 32);
  CHECK(client.hello()->client_id == hello_result.reply.client_id);

  const auto value = pattern(1 << 20, 1);
  SECTION("spans the client exposes for each command") {
    Call<dma::kv::SetResult> set;
    client.async_set("k1", value, set.handler());
    const auto [set_ec, set_result] = set.get();
    INFO(set_result.detail);
    REQUIRE(!set_ec);
    CHECK(set_result.length == value.size());
    CHECK(set_result.crc == dma::checksum(value));
    std::vector<std::byte> into(2 << 20);
    Call<dma::kv::GetResult> get;
    client.async_get("k1", into, get.handler());
    const auto [get_ec, get_result] = get.get();
    INFO(get_result.detail);
    REQUIRE(!get_ec);
    REQUIRE(get_result.length == value.size());
    CHECK(std::equal(value.begin(), value.end(), into.begin()));
    CHECK(get_result.crc == dma::checksum(value));
  }
  SECTION("a region exposed once, at an offset") {
    std::vector<std::byte> memory(4 << 20);
    auto region = s.target->expose(memory);
    std::copy(value.begin(), value.end(), memory.begin() + 4096);
    Call<dma::kv::SetResult> set;
    client.async_set("k2", region, std::span<const std::byte>(memory).subspan(4096, value.size()), set.handler());
    REQUIRE(!set.get().first);
    Call<dma::kv::GetResult> get;
    const auto into = std::span(memory).subspan(2 << 20, 2 << 20);
    client.async_get("k2", region, into, get.handler());
    const auto [get_ec, get_result] = get.get();
    INFO(get_result.detail);
    REQUIRE(!get_ec);
    REQUIRE(get_result.length == value.size());
    CHECK(std::equal(value.begin(), value.end(), into.begin()));
  }
  SECTION("an empty value") {
    Call<dma::kv::SetResult> set;
    client.async_set("empty", std::span<const std::byte>(), set.handler());
    REQUIRE(!set.get().first);
    std::vector<std::byte> into(16);
    Call<dma::kv::GetResult> get;
    client.async_get("empty", into, get.handler());
    const auto [ec, result] = get.get();
    INFO(result.detail);
    CHECK(!ec);
    CHECK(result.length == 0);
  }
  SECTION("DMA.INFO") {
    Call<dma::kv::InfoResult> info;
    client.async_info(info.handler());
    const auto [ec, result] = info.get();
    REQUIRE(!ec);
    CHECK(result.text.find("dma_clients:1") != std::string::npos);
  }
}

TEST_CASE("100 pipelined DMA.SETs and DMA.GETs on one connection complete in order, every byte back", "[client]") {
  Server server;
  Setup s;
  dma::kv::Client client(s.thread.io(), s.shared);
  REQUIRE(connect(client, server.port()) == std::error_code());
  REQUIRE(!hello(client).first);
  constexpr std::size_t count = 100, size = 8192;
  std::vector<std::byte> memory(2 * count * size);
  auto region = s.target->expose(memory);
  for (std::size_t i = 0; i < count; ++i) {
    const auto value = pattern(size - i, static_cast<unsigned>(i));
    std::copy(value.begin(), value.end(), memory.begin() + static_cast<std::ptrdiff_t>(i * size));
  }
  std::mutex mutex;
  std::vector<std::size_t> order;
  std::atomic<std::size_t> failures{0};
  std::promise<void> all;
  std::atomic<std::size_t> left{2 * count};
  auto done = [&](std::size_t index, std::error_code ec, const std::string& detail) {
    if (ec) {
      ++failures;
      UNSCOPED_INFO("command " << index << ": " << detail);
    }
    {
      std::lock_guard lock(mutex);
      order.push_back(index);
    }
    if (--left == 0) all.set_value();
  };
  for (std::size_t i = 0; i < count; ++i) {
    const auto value = std::span<const std::byte>(memory).subspan(i * size, size - i);
    client.async_set("p" + std::to_string(i), region, value,
                     [&, i](std::error_code ec, dma::kv::SetResult r) { done(i, ec, r.detail); });
  }
  CHECK(client.pending() > 0);
  for (std::size_t i = 0; i < count; ++i) {
    const auto into = std::span(memory).subspan((count + i) * size, size);
    client.async_get("p" + std::to_string(i), region, into,
                     [&, i](std::error_code ec, dma::kv::GetResult r) { done(count + i, ec, r.detail); });
  }
  REQUIRE(all.get_future().wait_for(bound) == std::future_status::ready);
  CHECK(failures == 0);
  std::vector<std::size_t> expected(2 * count);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(order == expected);
  for (std::size_t i = 0; i < count; ++i) {
    const auto value = pattern(size - i, static_cast<unsigned>(i));
    CHECK(std::equal(value.begin(), value.end(), memory.begin() + static_cast<std::ptrdiff_t>((count + i) * size)));
  }
  CHECK(client.pending() == 0);
}

TEST_CASE("under notification confirmation a DMA.GET completes once its token's notification is in", "[client]") {
  Server server({"--confirm-gets", "notification"});
  Setup s;
  std::vector<std::unique_ptr<dma::kv::Client>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<dma::kv::Client>(s.thread.io(), s.shared));
    REQUIRE(connect(*clients.back(), server.port()) == std::error_code());
    const auto [ec, result] = hello(*clients.back());
    REQUIRE(!ec);
    CHECK(result.reply.confirmation == dma::kv::Confirmation::notification);
  }
  const auto value = pattern(256 << 10, 3);
  Call<dma::kv::SetResult> set;
  clients[0]->async_set("n", value, set.handler());
  REQUIRE(!set.get().first);
  // Several GETs in flight on several connections share the Target's notifications.
  std::vector<std::vector<std::byte>> into(6, std::vector<std::byte>(value.size()));
  std::vector<std::unique_ptr<Call<dma::kv::GetResult>>> gets;
  for (std::size_t i = 0; i < into.size(); ++i) {
    gets.push_back(std::make_unique<Call<dma::kv::GetResult>>());
    clients[i % clients.size()]->async_get("n", into[i], gets.back()->handler());
  }
  for (std::size_t i = 0; i < into.size(); ++i) {
    const auto [ec, result] = gets[i]->get();
    INFO(result.detail);
    CHECK(!ec);
    CHECK(into[i] == value);
  }
  CHECK(s.shared.strays() == 0);
}

TEST_CASE("the server's refusals arrive as their client errors", "[client]") {
  Server server({"--max-value", "4096"});
  Setup s;
  dma::kv::Client client(s.thread.io(), s.shared);
  REQUIRE(connect(client, server.port()) == std::error_code());
  REQUIRE(!hello(client).first);
  std::vector<std::byte> small(16);
  {
    Call<dma::kv::GetResult> get;
    client.async_get("absent", small, get.handler());
    const auto [ec, result] = get.get();
    CHECK(ec == client_error::no_such_key);
    CHECK(result.detail.find("no such key") != std::string::npos);
  }
  {
    Call<dma::kv::SetResult> set;
    const auto value = pattern(8192, 1);
    client.async_set("big", value, set.handler());
    const auto [ec, result] = set.get();
    CHECK(ec == client_error::value_too_large);
    CHECK(result.detail.find("exceeds the limit of 4096") != std::string::npos);
  }
  {
    Call<dma::kv::SetResult> set;
    const auto value = pattern(1000, 2);
    client.async_set("v", value, set.handler());
    REQUIRE(!set.get().first);
    Call<dma::kv::GetResult> get;
    client.async_get("v", small, get.handler());
    const auto [ec, result] = get.get();
    CHECK(ec == client_error::buffer_too_small);
    INFO(result.detail);
    CHECK(result.detail.find("1000 bytes") != std::string::npos);
  }
  // A refusal leaves the connection as it was.
  CHECK(client.is_open());
  Call<dma::kv::InfoResult> info;
  client.async_info(info.handler());
  CHECK(!info.get().first);
}

TEST_CASE("a command the client cannot send fails at once, saying why", "[client]") {
  Server server;
  Setup s;
  dma::kv::Client client(s.thread.io(), s.shared);
  std::vector<std::byte> bytes(64);
  {
    Call<dma::kv::SetResult> set;
    client.async_set("k", bytes, set.handler());
    const auto [ec, result] = set.get();
    CHECK(ec == client_error::not_connected);
    CHECK(result.detail.find("async_connect") != std::string::npos);
  }
  {
    Call<dma::kv::HelloResult> h;
    client.async_hello(h.handler());
    CHECK(h.get().first == client_error::not_connected);
  }
  REQUIRE(connect(client, server.port()) == std::error_code());
  {
    Call<dma::kv::GetResult> get;
    client.async_get("k", bytes, get.handler());
    const auto [ec, result] = get.get();
    CHECK(ec == client_error::no_hello);
    CHECK(result.detail.find("DMA.HELLO") != std::string::npos);
  }
  REQUIRE(!hello(client).first);
  {
    std::vector<std::byte> memory(4096);
    auto region = s.target->expose(memory);
    Call<dma::kv::SetResult> set;
    client.async_set("k", region, bytes, set.handler());  // bytes are not inside the region
    const auto [ec, result] = set.get();
    CHECK(ec == client_error::invalid_argument);
    CHECK(result.detail.find("inside the region") != std::string::npos);
  }
  {
    dma::kv::Client no_target(s.thread.io().get_executor());
    REQUIRE(connect(no_target, server.port()) == std::error_code());
    Call<dma::kv::InfoResult> info;
    no_target.async_info(info.handler());
    CHECK(!info.get().first);
    Call<dma::kv::HelloResult> h;
    no_target.async_hello(h.handler());
    CHECK(h.get().first == client_error::invalid_argument);
  }
  {
    // A port nothing listens on: the connection's own error.
    dma::kv::Client refused(s.thread.io(), s.shared);
    asio::io_context io;
    asio::ip::tcp::acceptor probe(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    const auto closed_port = probe.local_endpoint().port();
    probe.close();
    CHECK(connect(refused, closed_port).value() == ECONNREFUSED);
  }
}

TEST_CASE("every error reply of the protocol maps to its client error, and the connection stays", "[client]") {
  struct Case {
    std::string text;
    client_error error;
  };
  const std::vector<Case> cases{
      {dma::kv::errors::no_hello(std::nullopt), client_error::no_hello},
      {dma::kv::errors::transfer_failed("the peer's memory key was refused"), client_error::transfer_failed},
      {dma::kv::errors::crc_mismatch(12345), client_error::crc_mismatch},
      {dma::kv::errors::writes_paused(), client_error::try_again},
      {dma::kv::errors::slot_moved(), client_error::try_again},
      {dma::kv::errors::cluster_down(), client_error::cluster_down},
      {dma::kv::errors::value_memory_full(1, "max-value-memory"), client_error::out_of_memory},
      {dma::kv::errors::wrong_type(), client_error::wrong_type},
      {dma::kv::errors::no_such_key(), client_error::no_such_key},
      {dma::kv::errors::value_too_large(5, 4), client_error::value_too_large},
      {dma::kv::errors::buffer_too_small(5, 4), client_error::buffer_too_small},
      {"MOVED 3999 127.0.0.1:6381", client_error::redirected},
      {"ASK 3999 127.0.0.1:6381", client_error::redirected},
      {dma::kv::errors::shutting_down(), client_error::server_error},
  };
  std::size_t next = 0;
  ScriptedServer server([&](const std::vector<std::string>& request) -> std::optional<std::string> {
    if (request[0] == "DMA.HELLO") return hello_reply(request);
    return error_reply(cases.at(next++ % cases.size()).text);
  });
  Setup s;
  dma::kv::Client client(s.thread.io(), s.shared);
  REQUIRE(connect(client, server.port()) == std::error_code());
  REQUIRE(!hello(client).first);
  std::vector<std::byte> bytes(64);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO("reply " << cases[i].text);
    if (i % 2 == 0) {
      Call<dma::kv::SetResult> set;
      client.async_set("k", bytes, set.handler());
      const auto [ec, result] = set.get();
      CHECK(ec == cases[i].error);
      CHECK(result.detail == "DMA.SET: " + cases[i].text);
    } else {
      Call<dma::kv::GetResult> get;
      client.async_get("k", bytes, get.handler());
      const auto [ec, result] = get.get();
      CHECK(ec == cases[i].error);
      CHECK(result.detail == "DMA.GET: " + cases[i].text);
    }
    CHECK(!std::string(std::error_code(cases[i].error).message()).empty());
  }
  CHECK(client.is_open());
}

TEST_CASE("a reply that breaks RESP or the command's shape is a protocol error", "[client]") {
  // Every command but DMA.HELLO gets `garbage`; the server is made after it is set.
  std::string garbage;
  std::optional<ScriptedServer> server;
  auto serve = [&] {
    server.emplace([garbage](const std::vector<std::string>& request) -> std::optional<std::string> {
      if (request[0] == "DMA.HELLO") return hello_reply(request);
      return garbage;
    });
    return server->port();
  };
  Setup s;
  dma::kv::Client client(s.thread.io(), s.shared);
  std::vector<std::byte> into(64);
  SECTION("not RESP: the connection closes, and every command on it fails") {
    garbage = "%what\r\n";
    REQUIRE(connect(client, serve()) == std::error_code());
    REQUIRE(!hello(client).first);
    Call<dma::kv::GetResult> first;
    Call<dma::kv::GetResult> second;
    client.async_get("k", into, first.handler());
    client.async_get("k", into, second.handler());
    const auto [ec, result] = first.get();
    CHECK(ec == client_error::protocol_error);
    CHECK(result.detail.find("breaks RESP") != std::string::npos);
    CHECK(second.get().first == client_error::protocol_error);
    CHECK(!client.is_open());
  }
  SECTION("a DMA.GET reply of the wrong shape") {
    garbage = "+OK\r\n";
    REQUIRE(connect(client, serve()) == std::error_code());
    REQUIRE(!hello(client).first);
    Call<dma::kv::GetResult> get;
    client.async_get("k", into, get.handler());
    CHECK(get.get().first == client_error::protocol_error);
  }
  SECTION("a DMA.GET reply naming more bytes than the buffer holds") {
    garbage.clear();
    dma::kv::append_get_reply(garbage, 65, 0);
    REQUIRE(connect(client, serve()) == std::error_code());
    REQUIRE(!hello(client).first);
    Call<dma::kv::GetResult> get;
    client.async_get("k", into, get.handler());
    const auto [ec, result] = get.get();
    CHECK(ec == client_error::protocol_error);
    CHECK(result.detail.find("65 bytes for a buffer of 64") != std::string::npos);
  }
  SECTION("a DMA.GET whose bytes do not have the server's CRC") {
    garbage.clear();
    dma::kv::append_get_reply(garbage, 64, 12345);  // nothing was written: the bytes are zeros
    REQUIRE(connect(client, serve()) == std::error_code());
    REQUIRE(!hello(client).first);
    Call<dma::kv::GetResult> get;
    client.async_get("k", into, get.handler());
    const auto [ec, result] = get.get();
    CHECK(ec == client_error::crc_mismatch);
    CHECK(result.detail.find("12345") != std::string::npos);
  }
  SECTION("a DMA.HELLO reply of the wrong shape") {
    ScriptedServer odd([](const auto&) -> std::optional<std::string> { return std::string(":1\r\n"); });
    REQUIRE(connect(client, odd.port()) == std::error_code());
    CHECK(hello(client).first == client_error::protocol_error);
  }
}

TEST_CASE("a deadline fails its command, closes the connection and aborts the commands behind it", "[client]") {
  ScriptedServer silent([](const std::vector<std::string>& request) -> std::optional<std::string> {
    if (request[0] == "DMA.HELLO") return hello_reply(request);
    return std::string();  // never answers
  });
  Setup s;
  dma::kv::ClientOptions options;
  options.deadline = 10s;
  dma::kv::Client client(s.thread.io(), s.shared, options);
  REQUIRE(connect(client, silent.port()) == std::error_code());
  REQUIRE(!hello(client).first);
  std::vector<std::byte> bytes(64);
  Call<dma::kv::SetResult> quick;
  Call<dma::kv::SetResult> behind;
  const auto began = std::chrono::steady_clock::now();
  client.async_set({"k", bytes, nullptr, 300ms}, quick.handler());
  client.async_set("k2", bytes, behind.handler());  // the client's 10 s
  const auto [ec, result] = quick.get();
  const auto took = std::chrono::steady_clock::now() - began;
  CHECK(ec == client_error::timed_out);
  CHECK(result.detail.find("deadline of 300 ms") != std::string::npos);
  CHECK(took >= 300ms);
  CHECK(took < 9s);
  const auto [behind_ec, behind_result] = behind.get();
  CHECK(behind_ec == client_error::aborted);
  CHECK(behind_result.detail.find("deadline") != std::string::npos);
  CHECK(!client.is_open());
  Call<dma::kv::SetResult> after;
  client.async_set("k3", bytes, after.handler());
  const auto [after_ec, after_result] = after.get();
  CHECK(after_ec == client_error::not_connected);
  CHECK(after_result.detail.find("deadline") != std::string::npos);
  // A new connection works again.
  REQUIRE(connect(client, silent.port()) == std::error_code());
  CHECK(!hello(client).first);
}

TEST_CASE("a server that goes mid-command fails every pending command once, as server_gone", "[client]") {
  SECTION("a server that closes the connection") {
    ScriptedServer closing([](const std::vector<std::string>& request) -> std::optional<std::string> {
      if (request[0] == "DMA.HELLO") return hello_reply(request);
      return std::nullopt;
    });
    Setup s;
    dma::kv::Client client(s.thread.io(), s.shared);
    REQUIRE(connect(client, closing.port()) == std::error_code());
    REQUIRE(!hello(client).first);
    std::vector<std::byte> bytes(64);
    Call<dma::kv::SetResult> a;
    Call<dma::kv::GetResult> b;
    client.async_set("k", bytes, a.handler());
    client.async_get("k", bytes, b.handler());
    const auto [ec, result] = a.get();
    CHECK(ec == client_error::server_gone);
    CHECK(result.detail.find("lost") != std::string::npos);
    // The second command meets the loss too: pending when it is seen (server_gone), or started
    // after it on a slow machine (not_connected); either way it fails, once.
    const auto b_ec = b.get().first;
    CHECK((b_ec == client_error::server_gone || b_ec == client_error::not_connected));
  }
  SECTION("dma-kv-server killed while 16 MiB transfers are in flight") {
    auto server = std::make_unique<Server>(std::vector<std::string>{"--max-value", "16777216"});
    Setup s;
    dma::kv::Client client(s.thread.io(), s.shared);
    REQUIRE(connect(client, server->port()) == std::error_code());
    REQUIRE(!hello(client).first);
    const auto value = pattern(16 << 20, 5);
    std::atomic<int> completions{0}, gone{0}, stored{0};
    std::promise<void> all;
    constexpr int count = 8;
    for (int i = 0; i < count; ++i) {
      client.async_set("big" + std::to_string(i), value, [&](std::error_code ec, dma::kv::SetResult r) {
        if (!ec) {
          ++stored;
        } else if (ec == client_error::server_gone) {
          ++gone;
        } else {
          UNSCOPED_INFO("unexpected: " << ec.message() << ": " << r.detail);
        }
        if (++completions == count) all.set_value();
      });
    }
    Resp probe(server->port());
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (info_value(probe, "dma_sets_in_flight") == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(200us);
    server.reset();  // SIGKILL
    REQUIRE(all.get_future().wait_for(bound) == std::future_status::ready);
    CHECK(completions == count);
    CHECK(gone > 0);
    CHECK(stored + gone == count);
    CHECK(client.pending() == 0);
  }
}

TEST_CASE("CallbackClient: blocking and callback forms on a thread of its own", "[client]") {
  Server server;
  auto target = dma::TargetThread::start(loopback_configuration());
  dma::kv::ClientTarget shared(target->target());
  auto client = dma::kv::CallbackClient::start("127.0.0.1", server.port(), shared);
  CHECK(client->hello().token.size() == 32);
  const auto value = pattern(1 << 20, 9);
  std::error_code ec;
  const auto set = client->set({"cb", value, nullptr, {}}, ec);
  INFO(set.detail);
  REQUIRE(!ec);
  std::vector<std::byte> into(value.size());
  std::promise<std::pair<std::error_code, dma::kv::GetResult>> got;
  client->get({"cb", into, nullptr, {}}, [&](std::error_code e, dma::kv::GetResult r) {
    got.set_value({e, std::move(r)});
  });
  auto future = got.get_future();
  REQUIRE(future.wait_for(bound) == std::future_status::ready);
  const auto [get_ec, get_result] = future.get();
  REQUIRE(!get_ec);
  CHECK(get_result.length == value.size());
  CHECK(into == value);
  const auto info = client->info(ec);
  CHECK(!ec);
  CHECK(info.text.find("# Transfers") != std::string::npos);

  // A blocking call from a callback would wait for itself: refused.
  std::promise<std::error_code> inner;
  client->info([&](std::error_code, dma::kv::InfoResult) {
    std::error_code e;
    (void)client->info(e);
    inner.set_value(e);
  });
  auto inner_future = inner.get_future();
  REQUIRE(inner_future.wait_for(bound) == std::future_status::ready);
  CHECK(inner_future.get() == client_error::invalid_argument);

  std::string detail;
  auto refused = dma::kv::CallbackClient::start("127.0.0.1", 1, shared, {}, ec, &detail);
  CHECK(refused == nullptr);
  CHECK(ec);
  CHECK(detail.find("127.0.0.1:1") != std::string::npos);
}

TEST_CASE("TargetThread: a Target progressed on its own thread, named, paused and resumed", "[client]") {
  dma::TargetThread::Options options;
  options.name = "test-target";
  auto thread = dma::TargetThread::start(loopback_configuration(), options);
  CHECK(thread->thread_id() > 0);
  std::ifstream comm("/proc/self/task/" + std::to_string(thread->thread_id()) + "/comm");
  std::string name;
  std::getline(comm, name);
  CHECK(name == "test-target");
  std::vector<std::byte> memory(4096);
  auto region = thread->expose(memory);
  CHECK(!region.advertisement().to_string().empty());
  thread->pause();
  thread->pause();  // idempotent
  CHECK(thread->thread_id() == 0);
  thread->resume();
  CHECK(thread->thread_id() > 0);
  std::error_code ec;
  std::string detail;
  options.cpu = 1 << 20;
  CHECK(dma::TargetThread::start(loopback_configuration(), options, ec, &detail) == nullptr);
  CHECK(ec);
  CHECK(detail.find("CPU") != std::string::npos);
}

TEST_CASE("an idle client keeps nothing outstanding: run() returns once its commands are done", "[client]") {
  Server server;
  auto target = dma::TargetThread::start(loopback_configuration());
  dma::kv::ClientTarget shared(target->target());
  asio::io_context io;
  dma::kv::Client client(io, shared);  // the default deadline, 30 s, is armed while commands run
  std::error_code last = client_error::server_error;
  const auto value = pattern(4096, 4);
  client.async_connect("127.0.0.1", server.port(), [&](std::error_code ec) {
    REQUIRE(!ec);
    client.async_hello([&](std::error_code ec2, dma::kv::HelloResult) {
      REQUIRE(!ec2);
      client.async_set("idle", value, [&](std::error_code ec3, dma::kv::SetResult) { last = ec3; });
    });
  });
  const auto began = std::chrono::steady_clock::now();
  io.run_for(bound);
  CHECK(!last);
  CHECK(std::chrono::steady_clock::now() - began < 20s);
  CHECK(io.stopped());
}

TEST_CASE("a cancelled command completes at once, and its late reply is dropped on a connection that stays",
          "[client]") {
  // The first DMA.SET is answered only together with the second.
  std::size_t sets = 0;
  ScriptedServer holding([&](const std::vector<std::string>& request) -> std::optional<std::string> {
    if (request[0] == "DMA.HELLO") return hello_reply(request);
    return ++sets == 1 ? std::string() : std::string("+OK\r\n+OK\r\n");
  });
  Setup s;
  dma::kv::Client client(s.thread.io(), s.shared);
  REQUIRE(connect(client, holding.port()) == std::error_code());
  REQUIRE(!hello(client).first);
  std::vector<std::byte> bytes(64);
  asio::cancellation_signal signal;
  Call<dma::kv::SetResult> cancelled;
  client.async_set("first", bytes, asio::bind_cancellation_slot(signal.slot(), cancelled.handler()));
  // Emitted on the client's executor, as Asio's cancellation slots require of their signal.
  asio::post(s.thread.io(), [&] { signal.emit(asio::cancellation_type::terminal); });
  const auto [ec, result] = cancelled.get();
  CHECK(ec == asio::error::operation_aborted);
  CHECK(result.detail.find("cancelled") != std::string::npos);
  CHECK(client.is_open());
  Call<dma::kv::SetResult> second;
  client.async_set("second", bytes, second.handler());
  const auto [second_ec, second_result] = second.get();
  INFO(second_result.detail);
  CHECK(!second_ec);
  CHECK(client.pending() == 0);
}
