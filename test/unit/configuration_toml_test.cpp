// Configuration from TOML: the sample files, every kind of refusal (with file, line and key), the
// value syntaxes, and a round trip through to_toml() that covers every field.
#include <dma/configuration.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "../catch.hpp"
#include "../source_root.hpp"

using namespace std::chrono_literals;

namespace {

const std::string source_root = test::source_root();

// The error from_toml_string raises for `text` in the [dma-libfabric] section.
dma::ConfigurationError refusal(const std::string& text) {
  try {
    dma::Configuration::from_toml_string(text, dma::Configuration::default_section, "test.toml");
  } catch (const dma::ConfigurationError& error) {
    return error;
  }
  FAIL("accepted: " << text);
  throw std::logic_error("unreachable");
}

dma::Configuration load(const std::string& body) {
  return dma::Configuration::from_toml_string("[dma-libfabric]\n" + body);
}

}  // namespace

TEST_CASE("the sample tcp.toml loads with loopback settings", "[configuration][toml]") {
  const auto configuration = dma::Configuration::from_toml(source_root + "/config/tcp.toml");
  CHECK(configuration.providers == std::vector<dma::Provider>{dma::Provider::tcp});
  CHECK(configuration.bind == "127.0.0.1");
  CHECK(configuration.max_in_flight == 64u);
  CHECK(configuration.progress_deadline == 1s);
  CHECK(configuration.wait_mode == dma::WaitMode::adaptive);
  CHECK(configuration.spin_budget == 50us);
}

TEST_CASE("the sample efa.toml loads with efa-direct and no bind address", "[configuration][toml]") {
  const auto configuration = dma::Configuration::from_toml(source_root + "/config/efa.toml");
  CHECK(configuration.providers == std::vector<dma::Provider>{dma::Provider::efa_direct});
  CHECK(configuration.interfaces.empty());
  CHECK_FALSE(configuration.bind);
}

TEST_CASE("an empty section gives the defaults", "[configuration][toml]") { CHECK(load("") == dma::Configuration{}); }

TEST_CASE("an unknown key is refused naming file, line, column and key", "[configuration][toml]") {
  const auto error = refusal("[dma-libfabric]\nbind = \"127.0.0.1\"\nmax_inflight = 8\n");
  CHECK(error.origin() == "test.toml");
  CHECK(error.line() == 3);
  CHECK(error.column() == 1);
  CHECK(error.key() == "dma-libfabric.max_inflight");
  CHECK(error.code() == std::errc::invalid_argument);
  const std::string what = error.what();
  CHECK(what.rfind("test.toml:3:1: dma-libfabric.max_inflight: unknown key; the keys are providers,", 0) == 0);
  CHECK(what.find("max_in_flight") != std::string::npos);
}

TEST_CASE("a value of the wrong type is refused naming the key and both types", "[configuration][toml]") {
  const auto error = refusal("[dma-libfabric]\n\nmax_in_flight = \"64\"\n");
  CHECK(error.line() == 3);
  CHECK(error.key() == "dma-libfabric.max_in_flight");
  CHECK(std::string(error.what()) == "test.toml:3:17: dma-libfabric.max_in_flight: expected an integer, got a string");
  CHECK(refusal("[dma-libfabric]\nproviders = \"tcp\"").key() == "dma-libfabric.providers");
  CHECK(refusal("[dma-libfabric]\nforce_local_registration = 1").key() == "dma-libfabric.force_local_registration");
  CHECK(refusal("[dma-libfabric]\nspin_budget = 50").key() == "dma-libfabric.spin_budget");
}

TEST_CASE("an out-of-range value is refused with the allowed range", "[configuration][toml]") {
  const auto error = refusal("[dma-libfabric]\nmax_in_flight = 0\n");
  CHECK(error.line() == 2);
  CHECK(std::string(error.what()) ==
        "test.toml:2:17: dma-libfabric.max_in_flight: expected an integer from 1 to 1048576, got 0");
  CHECK(refusal("[dma-libfabric]\ncq_batch = -1").key() == "dma-libfabric.cq_batch");
  CHECK(refusal("[dma-libfabric]\ncq_size = 100000000").key() == "dma-libfabric.cq_size");
  const auto duration = refusal("[dma-libfabric]\nbackstop_interval = \"0ms\"");
  CHECK(std::string(duration.what()).find("expected a duration from 1us to 1min, got 0ns") != std::string::npos);
  CHECK(refusal("[dma-libfabric]\nprogress_deadline = \"25h\"").key() == "dma-libfabric.progress_deadline");
}

TEST_CASE("enum values use the spelling to_string prints, and nothing else", "[configuration][toml]") {
  CHECK(load("wait_mode = \"busy-poll\"").wait_mode == dma::WaitMode::busy_poll);
  CHECK(load("wait_mode = \"fd\"").wait_mode == dma::WaitMode::fd);
  CHECK(load("providers = [\"efa-direct\", \"tcp\"]").providers ==
        std::vector<dma::Provider>{dma::Provider::efa_direct, dma::Provider::tcp});
  const auto busy = refusal("[dma-libfabric]\nwait_mode = \"busy\"");
  CHECK(std::string(busy.what()) ==
        "test.toml:2:13: dma-libfabric.wait_mode: expected one of \"fd\", \"adaptive\", \"busy-poll\", got \"busy\"");
  CHECK(load("tcp_protocol = \"rxm\"").tcp_protocol == dma::TcpProtocol::rxm);
  CHECK(load("tcp_protocol = \"native\"").tcp_protocol == dma::TcpProtocol::native);
  CHECK(load("").tcp_protocol == dma::TcpProtocol::automatic);
  CHECK(std::string(refusal("[dma-libfabric]\ntcp_protocol = \"xnet\"").what()) ==
        "test.toml:2:16: dma-libfabric.tcp_protocol: expected one of \"auto\", \"native\", \"rxm\", got \"xnet\"");
  const auto efa = refusal("[dma-libfabric]\nproviders = [\"tcp\", \"efa\"]");
  CHECK(efa.key() == "dma-libfabric.providers[1]");
  CHECK(efa.column() == 21);
}

TEST_CASE("from_string parses exactly what to_string prints", "[configuration]") {
  for (const auto provider : {dma::Provider::tcp, dma::Provider::efa_direct, dma::Provider::shm}) {
    CHECK(dma::from_string<dma::Provider>(dma::to_string(provider)) == provider);
  }
  for (const auto mode : {dma::WaitMode::fd, dma::WaitMode::adaptive, dma::WaitMode::busy_poll}) {
    CHECK(dma::from_string<dma::WaitMode>(dma::to_string(mode)) == mode);
  }
  for (const auto protocol : {dma::TcpProtocol::automatic, dma::TcpProtocol::native, dma::TcpProtocol::rxm}) {
    CHECK(dma::from_string<dma::TcpProtocol>(dma::to_string(protocol)) == protocol);
  }
  CHECK_FALSE(dma::from_string<dma::TcpProtocol>("tcp;ofi_rxm"));
  CHECK_FALSE(dma::from_string<dma::WaitMode>("busy"));
  CHECK_FALSE(dma::from_string<dma::WaitMode>("Busy-Poll"));
  CHECK_FALSE(dma::from_string<dma::Provider>("efa"));
  CHECK_FALSE(dma::from_string<dma::Provider>(""));
}

TEST_CASE("durations are strings with a unit, or the Rust crate's secs and nanos table", "[configuration][toml]") {
  CHECK(load("progress_deadline = \"250ms\"").progress_deadline == 250ms);
  CHECK(load("progress_deadline = \"2min\"").progress_deadline == 2min);
  CHECK(load("spin_budget = \"0us\"").spin_budget == 0us);
  CHECK(load("spin_budget = \"750ns\"").spin_budget == 750ns);
  CHECK(load("progress_deadline = { secs = 2, nanos = 500000000 }").progress_deadline == 2500ms);
  for (const char* bad : {"\"10\"", "\"10 ms\"", "\"1.5s\"", "\"-1s\"", "\"ms\"", "\"10sec\"",
                          "\"99999999999999999999s\"", "{ secs = 1, millis = 5 }", "{ secs = -1 }"}) {
    CAPTURE(bad);
    CHECK(refusal(std::string("[dma-libfabric]\nprogress_deadline = ") + bad)
              .key()
              .rfind("dma-libfabric.progress_deadline", 0) == 0);
  }
}

TEST_CASE("byte sizes are integers or strings with a binary unit", "[configuration][toml]") {
  CHECK(load("registration_cache_bytes = 4096").registration_cache_bytes == 4096u);
  CHECK(load("registration_cache_bytes = \"64MiB\"").registration_cache_bytes == std::size_t{64} << 20);
  CHECK(load("registration_cache_bytes = \"0B\"").registration_cache_bytes == 0u);
  CHECK(refusal("[dma-libfabric]\nregistration_cache_bytes = \"64MB\"").key() ==
        "dma-libfabric.registration_cache_bytes");
}

TEST_CASE("strings must be non-empty and free of NUL", "[configuration][toml]") {
  CHECK(refusal("[dma-libfabric]\nbind = \"\"").key() == "dma-libfabric.bind");
  CHECK(refusal("[dma-libfabric]\nbind = \"127.0.0.1\\u0000x\"").key() == "dma-libfabric.bind");
  CHECK(refusal("[dma-libfabric]\ninterfaces = [\"\"]").key() == "dma-libfabric.interfaces[0]");
}

TEST_CASE("a missing section is refused; an empty section name reads the root table", "[configuration][toml]") {
  const auto error = refusal("[other]\nbind = \"127.0.0.1\"\n");
  CHECK(std::string(error.what()) == "test.toml: dma-libfabric: no [dma-libfabric] table");
  CHECK(error.line() == 0);
  CHECK(dma::Configuration::from_toml_string("bind = \"10.0.0.1\"", "").bind == "10.0.0.1");
  CHECK(dma::Configuration::from_toml_string("[app.dma]\ncq_batch = 8", "app.dma").cq_batch == 8u);
  CHECK_THROWS_AS(dma::Configuration::from_toml_string("dma-libfabric = 3"), dma::ConfigurationError);
}

TEST_CASE("a file that is not TOML is refused with the parser's position", "[configuration][toml]") {
  const auto error = refusal("[dma-libfabric]\nbind = 127.0.0.1\n");
  CHECK(error.origin() == "test.toml");
  CHECK(error.line() == 2);
  CHECK(error.key().empty());
  CHECK(std::string(error.what()).rfind("test.toml:2:", 0) == 0);
  CHECK(std::string(error.what()).find("not valid TOML") != std::string::npos);
}

TEST_CASE("a missing file reports the open error through the error-code overload", "[configuration][toml]") {
  std::error_code ec;
  std::string message;
  const auto configuration = dma::Configuration::from_toml("/nonexistent/dma.toml", "dma-libfabric", ec, message);
  CHECK(ec == std::errc::no_such_file_or_directory);
  CHECK(message == "/nonexistent/dma.toml: cannot read: No such file or directory");
  CHECK(configuration == dma::Configuration{});
  CHECK_THROWS_AS(dma::Configuration::from_toml("/nonexistent/dma.toml"), std::system_error);
}

TEST_CASE("the error-code overloads clear the error on success and report refusals", "[configuration][toml]") {
  std::error_code ec = std::make_error_code(std::errc::io_error);
  std::string message = "stale";
  auto configuration = dma::Configuration::from_toml(source_root + "/config/tcp.toml", "dma-libfabric", ec, message);
  CHECK_FALSE(ec);
  CHECK(message.empty());
  CHECK(configuration.bind == "127.0.0.1");
  configuration =
      dma::Configuration::from_toml_string("[dma-libfabric]\nwait = \"fd\"", "dma-libfabric", "cli", ec, message);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(message.rfind("cli:2:1: dma-libfabric.wait: unknown key", 0) == 0);
}

TEST_CASE("to_toml writes every field and reads back equal", "[configuration][toml]") {
  dma::Configuration changed;  // every field away from its default
  changed.providers = {dma::Provider::efa_direct, dma::Provider::tcp};
  changed.interfaces = {"rdmap16s27-rdm", "odd \"name\"\\"};
  changed.bind = "10.0.0.1";
  changed.max_in_flight = 8;
  changed.crc_pool_threads = 2;
  changed.efa_rnr_retry = 3;
  changed.port = 7471;
  changed.progress_deadline = 1500ms;
  changed.transfer_deadline = 45s;
  changed.unreachable_backoff = 250ms;
  changed.unreachable_backoff_max = 5s;
  changed.cq_size = 512;
  changed.wait_mode = dma::WaitMode::busy_poll;
  changed.spin_budget = 1234ns;
  changed.backstop_interval = 3ms;
  changed.cq_batch = 32;
  changed.force_local_registration = true;
  changed.registration_cache_entries = 7;
  changed.registration_cache_bytes = (std::size_t{3} << 30) + 1;
  const std::string text = changed.to_toml();
  CAPTURE(text);
  CHECK(dma::Configuration::from_toml_string(text) == changed);
  for (const auto key : dma::Configuration::toml_keys())
    CHECK(text.find("\n" + std::string(key) + " = ") != std::string::npos);

  const dma::Configuration defaults;
  const std::string default_text = defaults.to_toml("app.dma");
  CHECK(default_text.rfind("[app.dma]\n", 0) == 0);
  CHECK(default_text.find("# bind: not set") != std::string::npos);
  CHECK(default_text.find("registration_cache_bytes = \"16GiB\"") != std::string::npos);
  CHECK(dma::Configuration::from_toml_string(default_text, "app.dma") == defaults);
}

TEST_CASE("the example file of docs/configuration.md loads as described", "[configuration][toml]") {
  std::ifstream file(source_root + "/docs/configuration.md");
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  const auto start = doc.find("```toml\n");
  REQUIRE(start != std::string::npos);
  const auto body = start + 8;
  const auto end = doc.find("```", body);
  REQUIRE(end != std::string::npos);
  const auto configuration =
      dma::Configuration::from_toml_string(doc.substr(body, end - body), "dma-libfabric", "docs/configuration.md");
  CHECK(configuration.providers == std::vector<dma::Provider>{dma::Provider::efa_direct});
  CHECK(configuration.interfaces == std::vector<std::string>{"rdmap16s27-rdm"});
  CHECK(configuration.max_in_flight == 128u);
  CHECK(configuration.progress_deadline == 2s);
  CHECK(configuration.wait_mode == dma::WaitMode::busy_poll);
}

TEST_CASE("docs/configuration.md documents every key", "[configuration][toml]") {
  std::ifstream file(source_root + "/docs/configuration.md");
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  for (const auto key : dma::Configuration::toml_keys()) {
    CAPTURE(key);
    CHECK(text.str().find("| `" + std::string(key) + "` |") != std::string::npos);
  }
}
