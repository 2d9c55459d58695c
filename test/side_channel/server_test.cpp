// dma-kv-server driven from outside: redis-cli, hand-made RESP, bad input of every kind.
#include "process.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

using namespace side_channel_test;

namespace {

// A passive peer in the test process, with one buffer, progressed on its own thread.
class Peer {
 public:
  explicit Peer(std::size_t size) : thread_(dma::TargetThread::start(loopback_configuration())), memory_(size) {
    region_ = thread_->expose(memory_);
  }
  std::string address_hex() const { return dma::encode_hex(thread_->target().local_address()); }
  const dma::Advertisement& advertisement() const { return region_.advertisement(); }
  std::span<std::byte> memory() { return memory_; }

 private:
  std::unique_ptr<dma::TargetThread> thread_;
  std::vector<std::byte> memory_;
  dma::Target::Region region_;
};

// The hex of a sockaddr_in naming ip:port, as a tcp fabric address.
std::string sockaddr_hex(const char* ip, std::uint16_t port) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  REQUIRE(inet_pton(AF_INET, ip, &in.sin_addr) == 1);
  std::vector<std::uint8_t> bytes(sizeof in);
  std::memcpy(bytes.data(), &in, sizeof in);
  return dma::encode_hex(bytes);
}

std::string run_redis_cli(const Server& server, std::vector<std::string> arguments) {
  std::vector<std::string> all{"redis-cli", "-p", server.port_text()};
  all.insert(all.end(), arguments.begin(), arguments.end());
  Child cli(all);
  std::string out = cli.rest(30s);
  CHECK(cli.wait(30s) == 0);
  while (!out.empty() && out.back() == '\n')
    out.pop_back();
  return out;
}

void require_error(const dma::kv::resp::Reply& reply, std::string_view contains) {
  INFO("reply: " << reply.text);
  REQUIRE(reply.is_error());
  CHECK(reply.text.find(contains) != std::string_view::npos);
}

// The server still answers another client at once.
void require_serving(const Server& server) {
  Resp other(server.port());
  const auto pong = other.command({"PING"});
  CHECK(pong.text == "PONG");
}

}  // namespace

TEST_CASE("redis-cli drives PING, SET, GET, DEL and DMA.INFO", "[side_channel][redis-cli]") {
  if (!on_path("redis-cli")) FAIL("redis-cli not found: apt-get install redis-tools (./run deps does)");
  Server server;
  CHECK(run_redis_cli(server, {"PING"}) == "PONG");
  CHECK(run_redis_cli(server, {"SET", "greeting", "hello world"}) == "OK");
  CHECK(run_redis_cli(server, {"GET", "greeting"}) == "hello world");
  CHECK(run_redis_cli(server, {"DEL", "greeting", "missing"}) == "1");
  CHECK(run_redis_cli(server, {"GET", "greeting"}).empty());  // nil prints nothing when not a tty
  const auto info = run_redis_cli(server, {"DMA.INFO"});
  CHECK(info.find("keys:0") != std::string::npos);
  CHECK(info.find("outstanding:0") != std::string::npos);
  CHECK(info.find("provider:tcp") != std::string::npos);
}

TEST_CASE("a value stored by redis-cli comes back through the side channel and the other way", "[side_channel]") {
  if (!on_path("redis-cli")) FAIL("redis-cli not found: apt-get install redis-tools (./run deps does)");
  Server server;
  CHECK(run_redis_cli(server, {"SET", "inline", "0123456789"}) == "OK");
  Child get({client_program(), "--port", server.port_text(), "get", "inline"});
  CHECK(get.line() ==
        "inline: 10 bytes, crc32c " + std::to_string(dma::checksum(std::as_bytes(std::span("0123456789", 10)))));
  CHECK(get.wait() == 0);

  Child set({client_program(), "--port", server.port_text(), "set", "patterned", "--size", "300000"});
  const auto stored = set.line();
  CHECK(stored.rfind("stored patterned: 300000 bytes, crc32c ", 0) == 0);
  CHECK(set.wait() == 0);
  Child back({client_program(), "--port", server.port_text(), "get", "patterned"});
  CHECK(back.line() == "patterned: 300000 bytes, crc32c " + stored.substr(stored.rfind(' ') + 1));
  CHECK(back.line() == "the bytes are the pattern `set patterned --size 300000` writes");
  CHECK(back.wait() == 0);
}

TEST_CASE("bad commands get a RESP error and the connection keeps working", "[side_channel][robustness]") {
  Server server({"--max-value", "65536"});
  Resp resp(server.port());
  require_error(resp.command({"GET"}), "wrong number of arguments for 'get' command");
  require_error(resp.command({"SET", "k"}), "wrong number of arguments for 'set' command");
  require_error(resp.command({"DMA.HELLO"}), "wrong number of arguments for 'dma.hello' command");
  require_error(resp.command({"NOSUCH", "x"}), "unknown command 'NOSUCH'");
  require_error(resp.command({"DMA.SET", "k", "1", "0", "10"}), "DMA.HELLO first");
  require_error(resp.command({"DMA.GET", "k", "1", "0", "10"}), "DMA.HELLO first");
  require_error(resp.command({"DMA.HELLO", "zz"}), "not hex");
  require_error(resp.command({"DMA.HELLO", "abc"}), "not hex");
  require_error(resp.command({"DMA.HELLO", "0200"}), "invalid fabric address");
  require_error(resp.command({"DMA.HELLO", std::string(200, 'a')}), "longer than any supported format");
  require_error(resp.command({"SET", "big", std::string(65537, 'v')}), "exceeds the limit of 65536");
  CHECK(resp.command({"PING"}).text == "PONG");
  CHECK(info_number(server.port(), "hellos_rejected") == 4);
}

TEST_CASE("a HELLO naming another host's fabric address is refused unless the server allows it",
          "[side_channel][robustness]") {
  {
    Server server;
    Resp resp(server.port());
    require_error(resp.command({"DMA.HELLO", sockaddr_hex("10.1.2.3", 4000)}),
                  "names host 10.1.2.3, but the connection comes from 127.0.0.1");
    require_error(resp.command({"DMA.HELLO", sockaddr_hex("127.0.0.2", 4000)}), "names host 127.0.0.2");
    require_error(resp.command({"DMA.SET", "k", "1", "0", "10"}), "DMA.HELLO first");
  }
  Server trusting({"--allow-any-fabric-host"});
  Resp resp(trusting.port());
  const auto hello = resp.command({"DMA.HELLO", sockaddr_hex("127.0.0.2", 4000)});
  REQUIRE(hello.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(hello.elements.size() == 5);
  CHECK(hello.elements[3].text == "reply");    // tcp confirms delivery (confirmation_test.cpp has the rest)
  CHECK(hello.elements[4].text.size() == 32);  // the client's token
  require_error(resp.command({"DMA.HELLO", sockaddr_hex("127.0.0.2", 4000)}), "already sent");
}

TEST_CASE("DMA.SET and DMA.GET check lengths, keys and CRCs and leave the store unchanged on error",
          "[side_channel][robustness]") {
  Server server({"--max-value", "65536"});
  Peer peer(65536);
  Resp resp(server.port());
  const auto hello = resp.command({"DMA.HELLO", peer.address_hex()});
  REQUIRE(hello.type == dma::kv::resp::Reply::Type::array);
  const auto rkey = std::to_string(peer.advertisement().remote_key);
  const auto addr = std::to_string(peer.advertisement().remote_address);

  for (std::size_t i = 0; i < 1000; ++i)
    peer.memory()[i] = static_cast<std::byte>(i * 7);
  const auto crc = dma::checksum(peer.memory().first(1000));
  CHECK(resp.command({"DMA.SET", "k", rkey, addr, "1000", std::to_string(crc)}).text == "OK");

  require_error(resp.command({"DMA.SET", "k", rkey, addr, "65537"}), "exceeds the limit of 65536");
  require_error(resp.command({"DMA.SET", "k", "key", addr, "10"}), "invalid rkey 'key'");
  require_error(resp.command({"DMA.SET", "k", rkey, "-1", "10"}), "invalid remote address");
  require_error(resp.command({"DMA.SET", "k", rkey, "18446744073709551615", "10"}), "overflows");
  require_error(resp.command({"DMA.SET", "k", rkey, addr, "1000", "99999999999"}), "invalid crc32c");
  require_error(resp.command({"DMA.SET", "k", rkey, addr, "1000", std::to_string(crc ^ 1)}), "CRC mismatch");
  require_error(resp.command({"DMA.GET", "missing", rkey, addr, "65536"}), "no such key");
  require_error(resp.command({"DMA.GET", "k", rkey, addr, "999"}), "the value is 1000 bytes");

  // The same connection still moves bytes.
  std::memset(peer.memory().data(), 0, peer.memory().size());
  const auto got = resp.command({"DMA.GET", "k", rkey, addr, "65536"});
  INFO("DMA.GET replied " << got.text);
  REQUIRE(got.type == dma::kv::resp::Reply::Type::array);
  CHECK(got.elements[0].integer == 1000);
  CHECK(got.elements[1].integer == crc);
  CHECK(dma::checksum(peer.memory().first(1000)) == crc);

  // A key that does not match fails that transfer; the value stays, and another client reads it.
  require_error(resp.command({"DMA.SET", "k", std::to_string(peer.advertisement().remote_key + 1), addr, "1000"}),
                "transfer failed");
  Peer other(4096);
  Resp second(server.port());
  REQUIRE(second.command({"DMA.HELLO", other.address_hex()}).type == dma::kv::resp::Reply::Type::array);
  const auto read_back = second.command({"DMA.GET", "k", std::to_string(other.advertisement().remote_key),
                                         std::to_string(other.advertisement().remote_address), "4096"});
  INFO("DMA.GET replied " << read_back.text);
  REQUIRE(read_back.type == dma::kv::resp::Reply::Type::array);
  CHECK(dma::checksum(other.memory().first(1000)) == crc);
  CHECK(info_number(server.port(), "crc_mismatches") == 1);
  CHECK(info_number(server.port(), "keys") == 1);
  CHECK(wait_for_info(server.port(), "outstanding", 0) == 0);
  require_serving(server);
}

TEST_CASE("another connection names a client by its HELLO token; an unknown one gets -NOHELLO", "[side_channel]") {
  Server server;
  Peer peer(4096);
  for (std::size_t i = 0; i < 1000; ++i)
    peer.memory()[i] = static_cast<std::byte>(i * 3);
  const auto crc = std::to_string(dma::checksum(peer.memory().first(1000)));
  const auto rkey = std::to_string(peer.advertisement().remote_key);
  const auto addr = std::to_string(peer.advertisement().remote_address);
  Resp first(server.port());
  const auto hello = first.command({"DMA.HELLO", peer.address_hex()});
  REQUIRE(hello.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(hello.elements.size() == 5);
  const std::string token(hello.elements[4].text);
  Resp second(server.port());
  require_error(second.command({"DMA.SET", "k", rkey, addr, "1000", crc}), "NOHELLO");
  require_error(second.command({"DMA.SET", "k", rkey, addr, "1000", crc, "CLIENT", std::string(32, 'f')}), "NOHELLO");
  CHECK(second.command({"DMA.SET", "k", rkey, addr, "1000", crc, "CLIENT", token}).text == "OK");
  CHECK(first.command({"DMA.SET", "k2", rkey, addr, "1000"}).text == "OK");  // the HELLO's own connection, unnamed
  first.close();
  CHECK(wait_for_info(server.port(), "dma_clients", 0) == 0);
  const auto got = second.command({"DMA.GET", "k", rkey, addr, "4096", "CLIENT", token});
  INFO("DMA.GET replied " << got.text);
  REQUIRE(got.type == dma::kv::resp::Reply::Type::array);
  CHECK(std::to_string(got.elements[1].integer) == crc);
  CHECK(info_number(server.port(), "no_hello") == 2);
  CHECK(info_number(server.port(), "hello_bindings") == 1);
}

TEST_CASE("a megabyte line of garbage closes only its own connection", "[side_channel][robustness]") {
  Server server;
  Resp healthy(server.port());
  CHECK(healthy.command({"SET", "k", "v"}).text == "OK");
  Resp garbage(server.port());
  garbage.send_until_closed(std::string(1 << 20, 'x'));
  // The error reply may be lost to the reset that closing an unread socket sends; the count is not.
  if (const auto reply = garbage.reply_or_close()) {
    require_error(*reply, "too big inline request");
    CHECK(garbage.closed_by_peer());
  }
  Resp bulk(server.port());
  bulk.send_raw("*2\r\n$3\r\nGET\r\n$999999999999\r\n");
  require_error(bulk.reply(), "invalid bulk length");
  CHECK(bulk.closed_by_peer());
  CHECK(healthy.command({"GET", "k"}).text == "v");
  CHECK(info_number(server.port(), "protocol_errors") == 2);
}

TEST_CASE("a connection closed in the middle of a command leaves nothing behind", "[side_channel][robustness]") {
  Server server;
  Resp healthy(server.port());
  for (int i = 0; i < 20; ++i) {
    Resp partial(server.port());
    partial.send_raw("*3\r\n$3\r\nSET\r\n$1\r\na\r\n$100000\r\nonly a few bytes");
    partial.close();
  }
  CHECK(healthy.command({"PING"}).text == "PONG");
  CHECK(wait_for_info(server.port(), "connected_clients", 2) == 2);  // healthy and the DMA.INFO probe
  CHECK(info_number(server.port(), "keys") == 0);
}
