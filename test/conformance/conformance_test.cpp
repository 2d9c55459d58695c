// The side channel's conformance suite: test/conformance/cases.txt, one list of protocol cases,
// sent through raw RESP to one server and each reply compared with the expected one.
//   DMA_CONFORMANCE_SERVER=kv       dma-kv-server (DMA_KV_SERVER names it)
//   DMA_CONFORMANCE_SERVER=module   redis-server with the module (DMA_MODULE_SERVER names another
//                                   server program, e.g. Valkey; exit 77 when there is none)
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main
#include "../redis_module/harness.hpp"
#include "../source_root.hpp"

#include <dma/checksum.hpp>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>

namespace {

using namespace module_test;

struct Step {
  int line = 0;
  int connection = 1;
  std::string command;  ///< arguments separated by spaces, placeholders not yet filled
  std::string expect;   ///< the rendered reply, or the fields for `<fields`
  bool fields = false;
};

struct Case {
  std::string name;
  int line = 0;
  std::vector<Step> steps;
};

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::vector<Case> cases;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.rfind("## ", 0) == 0) {
      cases.push_back(Case{line.substr(3), number, {}});
    } else if (line.rfind("> ", 0) == 0) {
      INFO(path << ":" << number);
      REQUIRE(!cases.empty());
      Step step;
      step.line = number;
      step.command = line.substr(2);
      if (step.command.rfind('@', 0) == 0) {
        const auto space = step.command.find(' ');
        step.connection = std::stoi(step.command.substr(1, space - 1));
        step.command = step.command.substr(space + 1);
      }
      cases.back().steps.push_back(step);
    } else if (line.rfind("<fields ", 0) == 0 || line.rfind("< ", 0) == 0) {
      INFO(path << ":" << number);
      REQUIRE(!cases.empty());
      REQUIRE(!cases.back().steps.empty());
      auto& step = cases.back().steps.back();
      REQUIRE(step.expect.empty());
      step.fields = line[1] == 'f';
      step.expect = line.substr(step.fields ? 8 : 2);
    } else {
      INFO(path << ":" << number << ": " << line);
      REQUIRE((line.empty() || line[0] == '#'));
    }
  }
  return cases;
}

// One reply as one line: +simple, -error, :integer, "bulk", nil, [e1, e2].
std::string render(const dma::kv::resp::Reply& reply) {
  using Type = dma::kv::resp::Reply::Type;
  switch (reply.type) {
    case Type::simple:
      return "+" + std::string(reply.text);
    case Type::error:
      return "-" + std::string(reply.text);
    case Type::integer:
      return ":" + std::to_string(reply.integer);
    case Type::bulk:
      return "\"" + std::string(reply.text) + "\"";
    case Type::nil:
      return "nil";
    case Type::array: {
      std::string text = "[";
      for (std::size_t i = 0; i < reply.elements.size(); ++i)
        text += (i == 0 ? "" : ", ") + render(reply.elements[i]);
      return text + "]";
    }
  }
  return "?";
}

// `text` matches `pattern`, whose {*}, {int} and {hex} match runs of anything, digits and hex
// digits (at least one; {*} also none). Backtracking, for one-line patterns.
bool matches(std::string_view pattern, std::string_view text) {
  if (pattern.empty()) return text.empty();
  for (const auto& [token, accepts] : {std::pair<std::string_view, int>{"{*}", 0}, {"{int}", 1}, {"{hex}", 2}}) {
    if (pattern.rfind(token, 0) != 0) continue;
    const auto rest = pattern.substr(token.size());
    const auto ok = [&, accepts = accepts](char c) {
      return accepts == 0 || (accepts == 1 && c >= '0' && c <= '9') ||
             (accepts == 2 && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')));
    };
    for (std::size_t n = accepts == 0 ? 0 : 1; n <= text.size(); ++n) {
      if (n > 0 && !ok(text[n - 1])) break;
      if (matches(rest, text.substr(n))) return true;
    }
    return false;
  }
  return !text.empty() && pattern[0] == text[0] && matches(pattern.substr(1), text.substr(1));
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string word; in >> word;)
    words.push_back(word);
  return words;
}

std::string far_address() {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(40000);
  inet_pton(AF_INET, "10.0.0.1", &in.sin_addr);
  std::vector<std::uint8_t> bytes(sizeof in);
  std::memcpy(bytes.data(), &in, sizeof in);
  return dma::encode_hex(bytes);
}

// Fills the placeholders of a command or an expected reply; {*}, {int} and {hex} stay.
std::string fill(const std::string& text, Peer& peer, const std::string& token) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto close = text.find('}', i);
    if (text[i] != '{' || close == std::string::npos) {
      out += text[i++];
      continue;
    }
    const std::string name = text.substr(i + 1, close - i - 1);
    i = close + 1;
    if (name == "address") {
      out += peer.address_hex();
    } else if (name == "rkey") {
      out += peer.rkey();
    } else if (name == "addr") {
      out += peer.offset();
    } else if (name == "token") {
      out += token;
    } else if (name == "far-address") {
      out += far_address();
    } else if (name.rfind("crc:", 0) == 0) {
      const auto n = std::stoul(name.substr(4));
      out += std::to_string(dma::checksum(std::span<const std::byte>(peer.memory()).first(n)));
    } else if (name.rfind("repeat:", 0) == 0) {
      const auto colon = name.find(':', 7);
      const auto unit = name.substr(7, colon - 7);
      for (unsigned long n = std::stoul(name.substr(colon + 1)); n > 0; --n)
        out += unit;
    } else {
      out += "{" + name + "}";  // a pattern's own
    }
  }
  return out;
}

void run_cases(std::uint16_t port) {
  const auto cases = read_cases(test::source_root() + "/test/conformance/cases.txt");
  REQUIRE(cases.size() >= 20);
  Peer peer(1 << 20);
  for (std::size_t i = 0; i < peer.memory().size(); ++i)
    peer.memory()[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  std::size_t commands = 0;
  std::size_t failed = 0;
  for (const auto& c : cases) {
    std::map<int, std::unique_ptr<Resp>> connections;
    std::string token;
    for (const auto& step : c.steps) {
      auto& connection = connections[step.connection];
      if (!connection) connection = std::make_unique<Resp>(port);
      const auto arguments = split(fill(step.command, peer, token));
      const auto reply = connection->command(arguments);
      const std::string got = render(reply);
      if (dma::kv::resp::iequals(arguments[0], "DMA.HELLO") && reply.elements.size() == 5) {
        token = std::string(reply.elements[4].text);
      }
      bool ok = false;
      if (step.fields) {
        ok = reply.type == dma::kv::resp::Reply::Type::bulk;
        for (const auto& field : split(step.expect)) {
          const std::string text = "\n" + std::string(reply.text);
          ok = ok && text.find("\n" + field + ":") != std::string::npos;
        }
      } else {
        ok = matches(fill(step.expect, peer, token), got);
      }
      ++commands;
      if (!ok) ++failed;
      INFO("case \"" << c.name << "\", cases.txt:" << step.line << "\n  sent:     " << step.command
                     << "\n  expected: " << step.expect << "\n  got:      " << got);
      CHECK(ok);
    }
  }
  std::printf("%zu cases, %zu commands, %zu replies not as expected\n", cases.size(), commands, failed);
}

}  // namespace

TEST_CASE("every protocol case gets the expected reply", "[conformance]") {
  const char* which = std::getenv("DMA_CONFORMANCE_SERVER");
  const std::string server = which != nullptr ? which : "kv";
  if (server == "kv") {
    const auto kv = std::make_unique<Server>(std::vector<std::string>{"--max-value", "1048576"});
    run_cases(kv->port());
  } else {
    const auto module =
        std::make_unique<ModuleServer>(std::vector<std::string>{}, std::vector<std::string>{"max-value", "1048576"});
    run_cases(module->port());
  }
}

int main(int argc, char* argv[]) {
  const char* which = std::getenv("DMA_CONFORMANCE_SERVER");
  if (which != nullptr && std::string(which) == "module") return run_suite(argc, argv);
  return Catch::Session().run(argc, argv);
}
