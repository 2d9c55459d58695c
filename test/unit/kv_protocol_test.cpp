// The side channel's protocol alone (include/dma/kv/protocol.hpp): every parse, every refusal and
// the shapes of replies and INFO, without a server.
#include <dma/kv/hello_bindings.hpp>
#include <dma/kv/protocol.hpp>
#include <dma/kv/resp.hpp>

#include "../catch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace std::string_literals;
namespace kv = dma::kv;

std::vector<std::string_view> kv_words(std::initializer_list<std::string_view> list) { return list; }

std::vector<std::uint8_t> kv_sockaddr_v4(const char* ip, std::uint16_t port) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  inet_pton(AF_INET, ip, &in.sin_addr);
  std::vector<std::uint8_t> bytes(sizeof in);
  std::memcpy(bytes.data(), &in, sizeof in);
  return bytes;
}

std::string kv_hex(const std::vector<std::uint8_t>& bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  for (const auto b : bytes) {
    text += digits[b >> 4];
    text += digits[b & 0xf];
  }
  return text;
}

}  // namespace

TEST_CASE("protocol numbers are digits only, without sign or overflow", "[kv]") {
  CHECK(kv::parse_number("0") == 0u);
  CHECK(kv::parse_number("18446744073709551615") == UINT64_MAX);
  CHECK_FALSE(kv::parse_number("18446744073709551616"));
  CHECK_FALSE(kv::parse_number("99999999999999999999"));
  CHECK_FALSE(kv::parse_number("000000000000000000001"));  // 21 digits: longer than any u64
  CHECK_FALSE(kv::parse_number(""));
  CHECK_FALSE(kv::parse_number("+1"));
  CHECK_FALSE(kv::parse_number("-1"));
  CHECK_FALSE(kv::parse_number(" 1"));
  CHECK_FALSE(kv::parse_number("1 "));
  CHECK_FALSE(kv::parse_number("0x10"));
  CHECK_FALSE(kv::parse_number("1e3"));
}

TEST_CASE("a quoted argument is cut at 32 bytes and shows no control byte", "[kv]") {
  CHECK(kv::quote("abc") == "'abc'");
  CHECK(kv::quote(std::string(32, 'x')) == "'" + std::string(32, 'x') + "'");
  CHECK(kv::quote(std::string(33, 'x')) == "'" + std::string(32, 'x') + "...'");
  CHECK(kv::quote("a\r\nb\x7f"s + '\0') ==
        "'a?"
        "?b?"
        "?'");
}

TEST_CASE("the command table", "[kv]") {
  REQUIRE(kv::find_command("dma.set") == &kv::commands[1]);
  CHECK(kv::find_command("DMA.Get")->key_position == 1);
  CHECK_FALSE(kv::find_command("DMA.GET")->writes_key);
  CHECK(kv::find_command("DMA.SET")->writes_key);
  CHECK(kv::find_command("SET") == nullptr);
  CHECK(kv::arity_fits(kv::set_command, 5));
  CHECK(kv::arity_fits(kv::set_command, 8));
  CHECK_FALSE(kv::arity_fits(kv::set_command, 9));
  CHECK_FALSE(kv::arity_fits(kv::hello_command, 1));
}

TEST_CASE("DMA.SET's arguments", "[kv]") {
  const auto ok = kv::parse_set(kv_words({"DMA.SET", "k", "7", "4096", "100", "5", "CLIENT", "t"}), 1000);
  REQUIRE(ok.error.empty());
  CHECK(ok.key == "k");
  CHECK(ok.window.rkey == 7);
  CHECK(ok.window.address == 4096);
  CHECK(ok.window.length == 100);
  CHECK(ok.crc == 5u);
  CHECK(ok.client == "t");
  const auto bare = kv::parse_set(kv_words({"dma.set", "k", "7", "0", "0"}), 1000);
  CHECK(bare.error.empty());
  CHECK_FALSE(bare.crc);
  CHECK_FALSE(bare.client);
  const auto client_only = kv::parse_set(kv_words({"DMA.SET", "k", "7", "0", "1", "client", "t"}), 1000);
  CHECK(client_only.error.empty());
  CHECK_FALSE(client_only.crc);

  auto error = [](std::initializer_list<std::string_view> arguments, std::uint64_t max = 1000) {
    return kv::parse_set(kv_words(arguments), max).error;
  };
  CHECK(error({"DMA.SET", "k", "7", "0"}) == "ERR wrong number of arguments for 'dma.set' command");
  CHECK(error({"DMA.SET", "k", "+7", "0", "1"}) == "ERR invalid rkey '+7'");
  CHECK(error({"DMA.SET", "k", "7", "-0", "1"}) == "ERR invalid remote address '-0'");
  CHECK(error({"DMA.SET", "k", "7", "0", "1x"}) == "ERR invalid length '1x'");
  CHECK(error({"DMA.SET", "k", "7", "18446744073709551615", "1"}) == "ERR the remote range overflows");
  CHECK(error({"DMA.SET", "k", "7", "0", "4096", "+5"}) == "ERR invalid crc32c '+5'");
  CHECK(error({"DMA.SET", "k", "7", "0", "4096", "4294967296"}) == "ERR invalid crc32c '4294967296'");
  CHECK(error({"DMA.SET", "k", "7", "0", "4096", std::string_view("9999999999999999999999999999999999999")}) ==
        "ERR invalid crc32c '99999999999999999999999999999999...'");
  CHECK(error({"DMA.SET", "k", "7", "0", "1001"}) == "ERR value of 1001 bytes exceeds the limit of 1000");
  CHECK(error({"DMA.SET", "k", "7", "0", "0", "1"}) == "ERR CRC mismatch: an empty value has crc32c 0");
  CHECK(error({"DMA.SET", "k", "7", "0", "1", "5", "NAME", "t"}) == "ERR syntax error: expected CLIENT <token>");
  CHECK(error({"DMA.SET", "k", "7", "0", "1", "5", "CLIENT"}) ==
        "ERR syntax error: CLIENT needs the token DMA.HELLO returned");
  CHECK(error({"DMA.SET", "k", "7", "0", "1", "CLIENT", "t", "x"}) ==
        "ERR syntax error: nothing may follow CLIENT <token>");
  // The form is checked before the size: a bad rkey wins over a value too large.
  CHECK(error({"DMA.SET", "k", "x", "0", "5000"}) == "ERR invalid rkey 'x'");
}

TEST_CASE("DMA.GET's arguments", "[kv]") {
  const auto ok = kv::parse_get(kv_words({"DMA.GET", "k", "7", "0", "4096", "4294967295"}));
  REQUIRE(ok.error.empty());
  CHECK(ok.window.length == 4096);
  CHECK(ok.token == UINT32_MAX);
  CHECK(kv::parse_get(kv_words({"DMA.GET", "k", "7", "0", "+1"})).error == "ERR invalid capacity '+1'");
  CHECK(kv::parse_get(kv_words({"DMA.GET", "k", "7", "0", "1", "4294967296"})).error ==
        "ERR invalid token '4294967296': a notification token is a number below 2^32");
  CHECK(kv::parse_get(kv_words({"DMA.GET", "k", "7", "0", "1", "2", "3"})).error ==
        "ERR syntax error: expected CLIENT <token>");
  CHECK(kv::parse_get(kv_words({"DMA.GET"})).error == "ERR wrong number of arguments for 'dma.get' command");
}

TEST_CASE("DMA.HELLO's address and the same-host rule", "[kv]") {
  const auto address = kv_sockaddr_v4("127.0.0.1", 5000);
  const auto ok = kv::parse_hello(kv_words({"DMA.HELLO", kv_hex(address)}), FI_SOCKADDR_IN);
  REQUIRE(ok.error.empty());
  CHECK(ok.address == address);
  CHECK(kv::parse_hello(kv_words({"DMA.HELLO"}), FI_SOCKADDR_IN).error ==
        "ERR wrong number of arguments for 'dma.hello' command");
  CHECK(kv::parse_hello(kv_words({"DMA.HELLO", "zz"}), FI_SOCKADDR_IN).error == "ERR invalid fabric address: not hex");
  CHECK(kv::parse_hello(kv_words({"DMA.HELLO", std::string(1000, 'a')}), FI_SOCKADDR_IN).error ==
        "ERR invalid fabric address: longer than any supported format");
  CHECK(
      kv::parse_hello(kv_words({"DMA.HELLO", "0102"}), FI_SOCKADDR_IN).error.rfind("ERR invalid fabric address: ", 0) ==
      0);

  CHECK(kv::check_same_host(address, FI_SOCKADDR_IN, "127.0.0.1").empty());
  CHECK(kv::check_same_host(address, FI_SOCKADDR_IN, "::ffff:127.0.0.1").empty());
  CHECK(kv::check_same_host(address, FI_SOCKADDR_IN, "10.0.0.1") ==
        "the fabric address names host 127.0.0.1, but the connection comes from 10.0.0.1");
  CHECK(kv::check_same_host(address, FI_SOCKADDR_IN, "nowhere") == "the connection's address 'nowhere' is not an IP");
  CHECK(kv::check_same_host({}, FI_ADDR_EFA, "10.0.0.1").empty());  // no IP in the format: not checkable
  CHECK(kv::fabric_host(address, FI_SOCKADDR_IN) == "127.0.0.1");
}

TEST_CASE("reply shapes", "[kv]") {
  std::string out;
  kv::append_hello_reply(out, {"abcd", 3, 4096, kv::Confirmation::notification, "00ff"});
  kv::resp::Reply reply;
  REQUIRE(kv::resp::parse_reply(out, {}, reply).status == kv::resp::Status::complete);
  REQUIRE(reply.elements.size() == 5);
  CHECK(reply.elements[0].text == "abcd");
  CHECK(reply.elements[1].integer == 3);
  CHECK(reply.elements[2].integer == 4096);
  CHECK(reply.elements[3].text == "notification");
  CHECK(reply.elements[4].text == "00ff");
  const auto read = kv::read_hello_reply(reply);
  REQUIRE(read.error.empty());
  CHECK(read.reply.server_address_hex == "abcd");
  CHECK(read.reply.client_id == 3);
  CHECK(read.reply.max_value == 4096);
  CHECK(read.reply.confirmation == kv::Confirmation::notification);
  CHECK(read.reply.token == "00ff");

  out.clear();
  kv::append_get_reply(out, 10, UINT32_MAX);
  CHECK(out == "*2\r\n:10\r\n:4294967295\r\n");
  REQUIRE(kv::resp::parse_reply(out, {}, reply).status == kv::resp::Status::complete);
  const auto get = kv::read_get_reply(reply);
  CHECK(get.error.empty());
  CHECK(get.length == 10);
  CHECK(get.crc == UINT32_MAX);
}

TEST_CASE("a client reads errors and odd shapes as errors", "[kv]") {
  const auto parse = [](std::string_view text) {
    kv::resp::Reply reply;
    REQUIRE(kv::resp::parse_reply(text, {}, reply).status == kv::resp::Status::complete);
    return reply;
  };
  CHECK(kv::read_hello_reply(parse("-ERR invalid fabric address: not hex\r\n")).error ==
        "ERR invalid fabric address: not hex");
  CHECK_FALSE(kv::read_hello_reply(parse("+OK\r\n")).error.empty());
  CHECK_FALSE(kv::read_hello_reply(parse("*3\r\n$2\r\nab\r\n:-1\r\n:5\r\n")).error.empty());
  const auto old = kv::read_hello_reply(parse("*3\r\n$2\r\nab\r\n:1\r\n:5\r\n"));  // no confirmation, no token
  CHECK(old.error.empty());
  CHECK(old.reply.confirmation == kv::Confirmation::reply);
  CHECK(old.reply.token.empty());
  CHECK(kv::read_hello_reply(parse("*4\r\n$2\r\nab\r\n:1\r\n:5\r\n$5\r\nmaybe\r\n")).error ==
        "DMA.HELLO names an unknown confirmation 'maybe'");
  CHECK(kv::read_get_reply(parse("-NOHELLO send DMA.HELLO first\r\n")).error == "NOHELLO send DMA.HELLO first");
  CHECK_FALSE(kv::read_get_reply(parse("*2\r\n:1\r\n:4294967296\r\n")).error.empty());
  CHECK_FALSE(kv::read_get_reply(parse("*1\r\n:1\r\n")).error.empty());
}

TEST_CASE("error texts start with the code a client acts on and never carry a digest", "[kv]") {
  CHECK(kv::errors::no_hello(std::nullopt).rfind("NOHELLO ", 0) == 0);
  CHECK(kv::errors::no_hello("t").rfind("NOHELLO ", 0) == 0);
  CHECK(kv::errors::writes_paused().rfind("TRYAGAIN ", 0) == 0);
  CHECK(kv::errors::slot_moved().rfind("TRYAGAIN ", 0) == 0);
  CHECK(kv::errors::cluster_down().rfind("CLUSTERDOWN ", 0) == 0);
  CHECK(kv::errors::over_maxmemory().rfind("OOM ", 0) == 0);
  CHECK(kv::errors::wrong_type().rfind("WRONGTYPE ", 0) == 0);
  const auto mismatch = kv::errors::crc_mismatch(5);
  CHECK(mismatch.find(" 5;") != std::string::npos);
  CHECK(mismatch.find("read ") != std::string::npos);
  CHECK(mismatch.find("server read") == std::string::npos);
  CHECK(kv::errors::unknown_command(std::string(100, 'x')).size() < 80);
}

TEST_CASE("INFO has the protocol's fields in their sections and a server's own after them", "[kv]") {
  kv::InfoFields fields;
  fields.server = "test";
  fields.hellos = 2;
  fields.transfers_ok = 3;
  const auto plain = kv::info_text(fields);
  CHECK(plain.rfind("# Server\r\nserver:test\r\n", 0) == 0);
  CHECK(plain.find("\r\nhellos:2\r\n") != std::string::npos);
  CHECK(plain.find("\r\ntransfers_ok:3\r\n") != std::string::npos);
  CHECK(plain.find("# Keyspace") == std::string::npos);
  CHECK(plain.find("# Service") == std::string::npos);  // no service: no section
  const auto extra = kv::info_text(fields, [](kv::InfoSection section, kv::InfoText& text) {
    if (section == kv::InfoSection::keyspace) text.field("keys", std::uint64_t{9});
    if (section == kv::InfoSection::clients) text.flag("mine", true);
  });
  const auto clients = extra.find("# Clients");
  const auto keyspace = extra.find("# Keyspace\r\nkeys:9\r\n");
  const auto transfers = extra.find("# Transfers");
  CHECK(clients < extra.find("mine:yes"));
  CHECK(extra.find("mine:yes") < keyspace);
  CHECK(keyspace < transfers);
  CHECK(extra.find("# Memory") == std::string::npos);
}

TEST_CASE("HELLO bindings: tokens, sharing, idle drop and the cap", "[kv]") {
  using namespace std::chrono_literals;
  kv::HelloBindings bindings({2, 10s});
  std::vector<std::uint64_t> dropped;
  const auto a = bindings.bind(1, kv_sockaddr_v4("127.0.0.1", 1), dropped);
  const auto b = bindings.bind(2, kv_sockaddr_v4("127.0.0.1", 2), dropped);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->token.size() == 32);
  CHECK(a->token != b->token);
  CHECK_FALSE(bindings.bind(3, kv_sockaddr_v4("127.0.0.1", 3), dropped));  // both held
  CHECK(bindings.find(a->token, 2)->id == 1);                              // named by another connection: shared
  CHECK_FALSE(bindings.release(1));                                        // shared: stays
  CHECK(bindings.release(2));                                              // never shared: goes
  CHECK(bindings.size() == 1);
  CHECK(bindings.sweep(kv::HelloBindings::Clock::now()).empty());
  CHECK(bindings.sweep(kv::HelloBindings::Clock::now() + 11s) == std::vector<std::uint64_t>{1});
  CHECK_FALSE(bindings.find(a->token, 0));
  CHECK(bindings.dropped() == 1);
}

TEST_CASE("the protocol's settings, one parser for every server", "[kv]") {
  kv::ServerSettings settings;
  CHECK(kv::apply_setting(settings, "max-value", "4096") == "");
  CHECK(settings.max_value == 4096);
  CHECK(kv::apply_setting(settings, "max-value", "0") == "max-value takes a whole number of at least 1, not '0'");
  CHECK(kv::apply_setting(settings, "max-value", "+5") == "max-value takes a whole number of at least 1, not '+5'");
  CHECK(settings.max_value == 4096);
  CHECK(kv::apply_setting(settings, "transfer-deadline-ms", "0") == "");
  CHECK(kv::apply_setting(settings, "allow-any-fabric-host", "yes") == "");
  CHECK(settings.allow_any_fabric_host);
  CHECK(kv::apply_setting(settings, "allow-any-fabric-host", "1") == "allow-any-fabric-host takes yes or no, not '1'");
  CHECK(kv::apply_setting(settings, "confirm-gets", "notification") == "");
  CHECK(settings.confirm_gets == kv::Confirmation::notification);
  CHECK(kv::apply_setting(settings, "confirm-gets", "auto") == "");
  CHECK_FALSE(settings.confirm_gets);
  CHECK(kv::apply_setting(settings, "max-hello-bindings", "0") ==
        "max-hello-bindings takes a whole number of at least 1, not '0'");
  CHECK(kv::apply_setting(settings, "hello-idle-seconds", "5") == "");
  CHECK(settings.hello_idle_seconds == 5);
  CHECK_FALSE(kv::apply_setting(settings, "pool-threads", "2"));  // not the protocol's
  // Every setting the table names is one apply_setting takes, at its default.
  for (const auto& setting : kv::settings) {
    kv::ServerSettings defaults;
    INFO(setting.name);
    CHECK(kv::apply_setting(defaults, setting.name, setting.fallback) == "");
  }
}

TEST_CASE("a client's commands parse back to what it meant", "[kv]") {
  const kv::Window window{7, 4096, 100};
  const auto set = kv::set_arguments("k", window, 5u, "tok");
  const std::vector<std::string_view> set_views(set.begin(), set.end());
  const auto parsed_set = kv::parse_set(set_views, 1000);
  REQUIRE(parsed_set.error.empty());
  CHECK(parsed_set.key == "k");
  CHECK(parsed_set.window.rkey == 7);
  CHECK(parsed_set.window.address == 4096);
  CHECK(parsed_set.window.length == 100);
  CHECK(parsed_set.crc == 5u);
  CHECK(parsed_set.client == "tok");

  const auto get = kv::get_arguments("k", window, std::nullopt, "");
  CHECK(get == std::vector<std::string>{"DMA.GET", "k", "7", "4096", "100"});
  const auto notified = kv::get_arguments("k", window, 9u, "");
  const std::vector<std::string_view> get_views(notified.begin(), notified.end());
  CHECK(kv::parse_get(get_views).token == 9u);

  const auto hello = kv::hello_arguments(kv_sockaddr_v4("127.0.0.1", 1));
  const std::vector<std::string_view> hello_views(hello.begin(), hello.end());
  CHECK(kv::parse_hello(hello_views, FI_SOCKADDR_IN).error.empty());
}
