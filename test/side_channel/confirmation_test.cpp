// DMA.GET under notification confirmation, over tcp (where the server is told to use it): the
// DMA.HELLO reply names the confirmation, each DMA.GET that carries a token is written with it as
// immediate data, and a client reads its buffer only once its Target's notification with that
// token has arrived. Pipelined GETs of several connections share one Target, matched by value.
#include "notification_router.hpp"
#include "pattern.hpp"
#include "process.hpp"

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>

#include <cstring>

using namespace side_channel_test;

namespace {

// One Target in the test process, progressed on its own thread, whose notifications a router
// matches to tokens; connections expose their buffers on it.
class SharedTarget {
 public:
  SharedTarget() : thread_(dma::TargetThread::start(loopback_configuration())), router_(thread_->target()) {}
  std::string address_hex() const { return dma::encode_hex(thread_->target().local_address()); }
  dma::Target::Region expose(std::span<std::byte> buffer) { return thread_->expose(buffer); }
  kv::NotificationRouter& router() { return router_; }

  /// Waits for each token's notification, in the order given; fails the test on any that is missing.
  void wait_all(const std::vector<std::uint32_t>& tokens) {
    auto done = asio::co_spawn(
        thread_->target().get_executor(),
        [&]() -> asio::awaitable<void> {
          for (const auto token : tokens)
            co_await router_.wait(token, 20s);
        },
        asio::use_future);
    try {
      done.get();
    } catch (const kv::NotificationRouter::Missing& missing) {
      FAIL(missing.what());
    }
  }

 private:
  std::unique_ptr<dma::TargetThread> thread_;
  kv::NotificationRouter router_;
};

// A DMA.HELLO reply's confirmation, or "" when it names none.
std::string hello(Resp& resp, const SharedTarget& target) {
  const auto reply = resp.command({"DMA.HELLO", target.address_hex()});
  INFO("DMA.HELLO replied " << reply.text);
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(reply.elements.size() >= 3);
  return reply.elements.size() >= 4 ? std::string(reply.elements[3].text) : std::string();
}

std::string encode(const std::vector<std::string>& arguments) {
  std::vector<std::string_view> views(arguments.begin(), arguments.end());
  std::string out;
  dma::kv::resp::encode_command(out, views);
  return out;
}

std::string text_of(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// One connection with a buffer of `slots` slots of `slot_size` bytes on the shared target.
struct Connection {
  Connection(const Server& server, SharedTarget& target, std::size_t slots, std::size_t slot_size)
      : resp(server.port()), memory(slots * slot_size), slot_size(slot_size) {
    region = target.expose(memory);
    confirmation = hello(resp, target);
  }
  std::vector<std::string> get(const std::string& key, std::size_t slot, std::optional<std::uint32_t> token) const {
    const auto& a = region.advertisement();
    std::vector<std::string> command{"DMA.GET", key, std::to_string(a.remote_key),
                                     std::to_string(a.remote_address + slot * slot_size), std::to_string(slot_size)};
    if (token) command.push_back(std::to_string(*token));
    return command;
  }
  std::span<std::byte> slot(std::size_t i) { return std::span(memory).subspan(i * slot_size, slot_size); }

  Resp resp;
  std::vector<std::byte> memory;
  std::size_t slot_size;
  dma::Target::Region region;
  std::string confirmation;
};

}  // namespace

TEST_CASE("DMA.HELLO names the confirmation: reply where tcp confirms delivery, or what the server was told",
          "[side_channel][confirmation]") {
  SharedTarget target;
  for (const auto& [setting, expected] : std::vector<std::pair<std::string, std::string>>{
           {"", "reply"}, {"auto", "reply"}, {"reply", "reply"}, {"notification", "notification"}}) {
    INFO("--confirm-gets " << setting);
    Server server(setting.empty() ? std::vector<std::string>{} : std::vector<std::string>{"--confirm-gets", setting});
    Resp resp(server.port());
    CHECK(hello(resp, target) == expected);
    CHECK(info_field(resp, "get_confirmation") == expected);
  }
}

TEST_CASE("a DMA.GET with a token notifies the client's Target with it once the bytes have landed",
          "[side_channel][confirmation]") {
  Server server({"--confirm-gets", "notification"});
  SharedTarget target;
  Connection connection(server, target, 1, 1 << 20);
  const kv::Pattern pattern(1 << 20);
  const auto value = pattern.value(7, 1 << 20);
  REQUIRE(connection.resp.command({"SET", "k", text_of(value)}).text == "OK");

  const auto token = target.router().issue();
  const auto reply = connection.resp.command(connection.get("k", 0, token));
  INFO("DMA.GET replied " << reply.text);
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(reply.elements.size() == 2);
  CHECK(reply.elements[0].integer == 1 << 20);
  target.wait_all({token});
  CHECK(std::memcmp(connection.slot(0).data(), value.data(), value.size()) == 0);
  CHECK(static_cast<std::uint32_t>(reply.elements[1].integer) == dma::checksum(value));

  // A token that does not fit efa-direct's 4 bytes of immediate data is refused before any write.
  auto too_wide = connection.get("k", 0, std::nullopt);
  too_wide.push_back("4294967296");
  const auto wide = connection.resp.command(too_wide);
  INFO("DMA.GET with token 2^32 replied " << wide.text);
  CHECK(wide.is_error());
  CHECK(wide.text.find("invalid token '4294967296'") != std::string_view::npos);
  CHECK(info_number(server.port(), "gets_notified") == 1);
  CHECK(target.router().strays() == 0);
}

TEST_CASE("a client that sends no token is served as before: the reply alone, no notification",
          "[side_channel][confirmation]") {
  Server server({"--confirm-gets", "notification"});
  SharedTarget target;
  Connection connection(server, target, 1, 4096);
  const std::string value(4000, 'v');
  REQUIRE(connection.resp.command({"SET", "k", value}).text == "OK");
  const auto reply = connection.resp.command(connection.get("k", 0, std::nullopt));
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
  CHECK(reply.elements[0].integer == 4000);
  CHECK(text_of(connection.slot(0).first(4000)) == value);  // on tcp the reply does mean landed
  // A token's GET after it: the only notification the Target hears is that one's.
  const auto token = target.router().issue();
  REQUIRE(connection.resp.command(connection.get("k", 0, token)).type == dma::kv::resp::Reply::Type::array);
  target.wait_all({token});
  CHECK(target.router().strays() == 0);
  CHECK(info_number(server.port(), "gets_notified") == 1);
}

TEST_CASE("pipelined DMA.GETs of four connections sharing one Target each land every byte by their notification",
          "[side_channel][confirmation][pipelining]") {
  Server server({"--confirm-gets", "notification", "--threads", "2"});
  SharedTarget target;
  constexpr std::size_t connections = 4, slots = 16, slot_size = 256 << 10;
  const kv::Pattern pattern(slot_size);
  // Sizes from 0 B (written by no write, so notified by nothing) to a full slot.
  auto length_of = [&](std::size_t c, std::size_t s) -> std::size_t {
    if (s == 0) return 0;
    return std::min<std::size_t>(slot_size, (std::size_t{1} << (s + c) % 19) + s * 131 + c);
  };
  auto key_of = [](std::size_t c, std::size_t s) { return "p" + std::to_string(c) + ":" + std::to_string(s); };
  auto seed_of = [](std::size_t c, std::size_t s) { return c * 1000 + s; };

  std::vector<std::unique_ptr<Connection>> clients;
  for (std::size_t c = 0; c < connections; ++c) {
    clients.push_back(std::make_unique<Connection>(server, target, slots, slot_size));
    REQUIRE(clients.back()->confirmation == "notification");
    std::string sets;
    for (std::size_t s = 0; s < slots; ++s)
      sets += encode({"SET", key_of(c, s), text_of(pattern.value(seed_of(c, s), length_of(c, s)))});
    clients.back()->resp.send_raw(sets);
    for (std::size_t s = 0; s < slots; ++s)
      REQUIRE(clients.back()->resp.reply().text == "OK");
  }

  // Every connection's GETs go out in one batch before any reply is read.
  std::vector<std::vector<std::uint32_t>> tokens(connections);
  for (std::size_t c = 0; c < connections; ++c) {
    std::string batch;
    for (std::size_t s = 0; s < slots; ++s) {
      tokens[c].push_back(target.router().issue());
      batch += encode(clients[c]->get(key_of(c, s), s, tokens[c].back()));
    }
    clients[c]->resp.send_raw(batch);
  }
  std::vector<std::uint32_t> landing;  // the tokens of values that were written
  for (std::size_t c = 0; c < connections; ++c) {
    for (std::size_t s = 0; s < slots; ++s) {
      const auto reply = clients[c]->resp.reply();
      INFO("connection " << c << ", slot " << s << ": DMA.GET replied " << reply.text);
      REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
      REQUIRE(reply.elements[0].integer == static_cast<std::int64_t>(length_of(c, s)));
      CHECK(static_cast<std::uint32_t>(reply.elements[1].integer) ==
            dma::checksum(pattern.value(seed_of(c, s), length_of(c, s))));
      if (length_of(c, s) > 0) {
        landing.push_back(tokens[c][s]);
      } else {
        target.router().forget(tokens[c][s]);
      }
    }
  }
  target.wait_all(landing);
  for (std::size_t c = 0; c < connections; ++c) {
    for (std::size_t s = 0; s < slots; ++s) {
      INFO("connection " << c << ", slot " << s);
      const auto expected = pattern.value(seed_of(c, s), length_of(c, s));
      CHECK(std::memcmp(clients[c]->slot(s).data(), expected.data(), expected.size()) == 0);
    }
  }
  CHECK(info_number(server.port(), "gets_notified") == landing.size());
  CHECK(landing.size() == connections * (slots - 1));
  CHECK(target.router().strays() == 0);
  CHECK(wait_for_info(server.port(), "outstanding", 0) == 0);
}

TEST_CASE("dma-kv-client bench with 16 clients on one Target reads every byte after its notification",
          "[side_channel][confirmation][load]") {
  Server server({"--confirm-gets", "notification", "--threads", "2"});
  Child bench({client_program(), "--port", server.port_text(), "bench", "--clients", "16", "--ops", "100", "--sizes",
               "1-256K", "--keys", "4", "--arms", "dma", "--json"});
  const auto gets = require_notified_bench(bench);
  CHECK(static_cast<double>(info_number(server.port(), "gets_notified")) == gets);

  Child set({client_program(), "--port", server.port_text(), "set", "one", "--size", "300000"});
  CHECK(set.wait() == 0);
  Child get({client_program(), "--port", server.port_text(), "get", "one"});
  CHECK(get.line().rfind("one: 300000 bytes, crc32c ", 0) == 0);
  CHECK(get.line() == "the bytes are the pattern `set one --size 300000` writes");
  CHECK(get.wait() == 0);
}
