// The RESP parsers: requests as redis-server accepts them, replies, limits, and random input.
#include <dma/kv/resp.hpp>

#include "../catch.hpp"

#include "resp_fuzz.hpp"

#include <random>
#include <string>
#include <vector>

namespace {

using dma::kv::resp::Status;

std::vector<std::string> parse_all(std::string_view input, Status& last) {
  dma::kv::resp::Limits limits;
  std::vector<std::string_view> arguments;
  const auto parsed = dma::kv::resp::parse_request(input, limits, arguments);
  last = parsed.status;
  return std::vector<std::string>(arguments.begin(), arguments.end());
}

}  // namespace

TEST_CASE("a multibulk request parses into its arguments", "[resp]") {
  Status status{};
  const auto arguments = parse_all("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\r\nv!\r\n", status);
  CHECK(status == Status::complete);
  CHECK(arguments == std::vector<std::string>{"SET", "k", "v\r\nv!"});
}

TEST_CASE("an inline request splits on spaces and accepts a bare newline", "[resp]") {
  Status status{};
  CHECK(parse_all("PING\r\n", status) == std::vector<std::string>{"PING"});
  CHECK(parse_all("  GET   key\n", status) == std::vector<std::string>{"GET", "key"});
  CHECK(status == Status::complete);
}

TEST_CASE("every prefix of a request is incomplete, and consumes nothing", "[resp]") {
  const std::string request = "*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n";
  dma::kv::resp::Limits limits;
  std::vector<std::string_view> arguments;
  for (std::size_t n = 0; n < request.size(); ++n) {
    const auto parsed = dma::kv::resp::parse_request(std::string_view(request).substr(0, n), limits, arguments);
    INFO("prefix of " << n << " bytes");
    CHECK(parsed.status == Status::incomplete);
    CHECK(parsed.consumed == 0);
    CHECK(arguments.empty());
  }
  CHECK(dma::kv::resp::parse_request(request, limits, arguments).consumed == request.size());
}

TEST_CASE("a request that breaks a limit is a protocol error naming the limit", "[resp]") {
  dma::kv::resp::Limits limits;
  limits.max_inline = 16;
  limits.max_arguments = 2;
  limits.max_bulk = 8;
  std::vector<std::string_view> arguments;
  const auto inline_line = dma::kv::resp::parse_request(std::string(17, 'x'), limits, arguments);
  CHECK(inline_line.status == Status::error);
  CHECK(inline_line.error.find("too big inline request") != std::string::npos);
  const auto bulk = dma::kv::resp::parse_request("*1\r\n$9\r\n", limits, arguments);
  CHECK(bulk.status == Status::error);
  CHECK(bulk.error.find("invalid bulk length 9") != std::string::npos);
  CHECK(dma::kv::resp::parse_request("*3\r\n", limits, arguments).status == Status::error);
  CHECK(dma::kv::resp::parse_request("*1\r\n+OK\r\n", limits, arguments).status == Status::error);
  CHECK(dma::kv::resp::parse_request("*1\r\n$2\r\nabcd", limits, arguments).status == Status::error);
  CHECK(dma::kv::resp::parse_request("*x\r\n", limits, arguments).status == Status::error);
  CHECK(dma::kv::resp::parse_request("*" + std::string(40, '1'), limits, arguments).status == Status::error);
}

TEST_CASE("an incomplete bulk says how long the whole request is", "[resp]") {
  dma::kv::resp::Limits limits;
  std::vector<std::string_view> arguments;
  const auto parsed = dma::kv::resp::parse_request("*2\r\n$3\r\nSET\r\n$100\r\nab", limits, arguments);
  CHECK(parsed.status == Status::incomplete);
  CHECK(parsed.needed == 13 + 6 + 102);
}

TEST_CASE("replies of every type parse, nested arrays included", "[resp]") {
  dma::kv::resp::Limits limits;
  dma::kv::resp::Reply reply;
  const std::string input = "*3\r\n$4\r\nab\r\n\r\n:-42\r\n*2\r\n+OK\r\n-ERR no\r\n";
  const auto parsed = dma::kv::resp::parse_reply(input, limits, reply);
  REQUIRE(parsed.status == Status::complete);
  CHECK(parsed.consumed == input.size());
  REQUIRE(reply.elements.size() == 3);
  CHECK(reply.elements[0].text == "ab\r\n");
  CHECK(reply.elements[1].integer == -42);
  CHECK(reply.elements[2].elements[1].is_error());
  CHECK(dma::kv::resp::parse_reply("$-1\r\n", limits, reply).status == Status::complete);
  CHECK(reply.type == dma::kv::resp::Reply::Type::nil);
  CHECK(dma::kv::resp::parse_reply("?\r\n", limits, reply).status == Status::error);
}

TEST_CASE("encoded commands parse back, and errors never carry a line break", "[resp]") {
  std::string out;
  const std::vector<std::string_view> arguments{"DMA.SET", "k", "", std::string_view("\0\r\n", 3)};
  dma::kv::resp::encode_command(out, arguments);
  Status status{};
  const auto back = parse_all(out, status);
  CHECK(back == std::vector<std::string>(arguments.begin(), arguments.end()));
  std::string error;
  dma::kv::resp::append_error(error, "ERR a\r\nb");
  CHECK(error == "-ERR a  b\r\n");
}

TEST_CASE("random and mutated input never breaks the parsers' invariants", "[resp][fuzz]") {
  std::mt19937_64 rng(20261201);
  const std::vector<std::string> seeds{"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
                                       "PING\r\n",
                                       "*1\r\n$-1\r\n",
                                       "*2\r\n+OK\r\n:12\r\n",
                                       "$5\r\nhello\r\n",
                                       "*-1\r\n",
                                       "GET a b c d e f g h i\n"};
  const std::string alphabet = "*$+-:\r\n0123456789-abc \t";
  for (int i = 0; i < 100000; ++i) {
    std::string input = seeds[rng() % seeds.size()];
    const int edits = static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = input.empty() ? 0 : rng() % input.size();
      switch (rng() % 4) {
        case 0:
          if (!input.empty()) input[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          input.insert(at, 1, static_cast<char>(rng()));
          break;
        case 2:
          if (!input.empty()) input.erase(at, 1);
          break;
        default:
          input += seeds[rng() % seeds.size()];
          break;
      }
    }
    side_channel_test::fuzz_resp(std::span(reinterpret_cast<const std::uint8_t*>(input.data()), input.size()));
  }
  SUCCEED("100000 inputs");
}
