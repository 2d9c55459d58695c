// The fabric core on its own: opening, describing and discovering over tcp on 127.0.0.1.
#include "fixture.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <set>

TEST_CASE("a tcp endpoint bound to 127.0.0.1 has a 16-byte AF_INET address with a port", "[loopback][endpoint]") {
  dma::Endpoint endpoint;
  endpoint.open(test::loopback_configuration());
  const auto& address = endpoint.local_address();
  REQUIRE(address.size() == sizeof(sockaddr_in));
  sockaddr_in in{};
  std::memcpy(&in, address.data(), sizeof in);
  CHECK(in.sin_family == AF_INET);
  CHECK(in.sin_port != 0);
  CHECK(ntohl(in.sin_addr.s_addr) == INADDR_LOOPBACK);
  CHECK_FALSE(dma::validate_address(address, endpoint.addr_format()));
}

TEST_CASE("describe() prints the seed's six lines", "[loopback][endpoint]") {
  dma::Endpoint endpoint;
  endpoint.open(test::loopback_configuration());
  const auto info = endpoint.describe();
  const auto lines = info.lines();
  REQUIRE(lines.size() == 6);
  CHECK(lines[0].rfind("provider: tcp", 0) == 0);
  CHECK(lines[1] == "addr_format: FI_SOCKADDR_IN");  // libfabric's name, from fi_tostr_r
  CHECK(lines[2].rfind("mr_mode: 0x", 0) == 0);
  CHECK(lines[3].find("|FI_RMA|") != std::string::npos);
  CHECK(lines[4] == "requires_local_mr: false");
  CHECK(lines[5] == "uses_virtual_addressing: false");
  CHECK(info.wait_fd);
  CHECK(endpoint.wait_fd() >= 0);
  CHECK(info.credits == 64);
  CHECK(info.cq_size >= info.credits);
}

TEST_CASE("the tcp provider resolves to tcp;ofi_rxm before libfabric 1.18, never net", "[loopback][endpoint]") {
  dma::Endpoint endpoint;
  endpoint.open(test::loopback_configuration());
  const auto provider = endpoint.describe().provider;
  CHECK(provider.find("net") == std::string::npos);
  const auto version = fi_version();
  if (FI_MAJOR(version) == 1 && FI_MINOR(version) < 18) CHECK(provider == "tcp;ofi_rxm");
}

TEST_CASE("tcp is native from libfabric 1.18 on, rxm where tcp_protocol asks or 1.17 has nothing else",
          "[loopback][endpoint]") {
  const bool rxm_only = FI_MAJOR(fi_version()) == 1 && FI_MINOR(fi_version()) < 18;
  auto configuration = test::loopback_configuration();
  {
    dma::Endpoint endpoint;
    endpoint.open(configuration);
    CHECK(endpoint.describe().provider == (rxm_only ? "tcp;ofi_rxm" : "tcp"));
  }
  configuration.tcp_protocol = dma::TcpProtocol::rxm;
  {
    dma::Endpoint endpoint;
    endpoint.open(configuration);
    CHECK(endpoint.describe().provider == "tcp;ofi_rxm");
  }
  configuration.tcp_protocol = dma::TcpProtocol::native;
  dma::Endpoint endpoint;
  if (rxm_only) {
    try {
      endpoint.open(configuration);
      FAIL("native tcp opened on libfabric 1.17");
    } catch (const std::system_error& error) {
      CHECK(error.code() == dma::errc::invalid_configuration);
      CHECK(std::string(error.what()).find("1.18 or later") != std::string::npos);
    }
  } else {
    endpoint.open(configuration);
    CHECK(endpoint.describe().provider == "tcp");
  }
}

TEST_CASE("a tcp endpoint can post 2048 transfers at once on either protocol", "[loopback][endpoint]") {
  // Native tcp grants 256 unless asked for more; rxm's default is 2048. The library asks.
  for (const auto protocol : {dma::TcpProtocol::automatic, dma::TcpProtocol::rxm}) {
    auto configuration = test::loopback_configuration();
    configuration.tcp_protocol = protocol;
    dma::Endpoint endpoint;
    endpoint.open(configuration);
    CHECK(endpoint.describe().tx_size >= 2048);
  }
}

TEST_CASE("credits are clamped by max_in_flight", "[loopback][endpoint]") {
  auto configuration = test::loopback_configuration();
  configuration.max_in_flight = 5;
  dma::Endpoint endpoint;
  endpoint.open(configuration);
  CHECK(endpoint.credits() == 5);
}

TEST_CASE("discover_domains lists the loopback domain once", "[loopback][endpoint]") {
  const auto names = dma::discover_domains(test::loopback_configuration());
  REQUIRE_FALSE(names.empty());
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
}

TEST_CASE("an unknown interface name fails with no_domain and names it", "[loopback][endpoint]") {
  auto configuration = test::loopback_configuration();
  configuration.interfaces = {"no-such-device0"};
  dma::Endpoint endpoint;
  std::error_code ec;
  endpoint.open(configuration, ec);
  CHECK(ec == dma::errc::no_domain);
  CHECK(endpoint.failed_step().find("no-such-device0") != std::string::npos);
  CHECK_FALSE(endpoint.is_open());
  try {
    endpoint.open(configuration);
    FAIL("opened an endpoint on a missing device");
  } catch (const std::system_error& error) {
    CHECK(std::string(error.what()).find("no-such-device0") != std::string::npos);
  }
}

TEST_CASE("a service on an address this host does not have fails to open with a clear error", "[loopback][endpoint]") {
  auto configuration = test::loopback_configuration();
  configuration.bind = "127.0.0.1.5";  // not an address at all
  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io.get_executor());
  std::error_code ec;
  service.open(configuration, ec);
  CHECK(ec);
  CHECK_FALSE(service.is_open());
}

TEST_CASE("submitting on a closed service completes with not_open", "[loopback][endpoint]") {
  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io.get_executor());
  auto future = service.submit(dma::TransferRequest<test::Payload>{}, test::completion_future());
  REQUIRE(test::run_until(io, future));
  CHECK(future.get().outcome.error() == dma::errc::not_open);
}

TEST_CASE("libfabric reports a version", "[loopback][endpoint]") {
  CHECK(fi_version() > 0);
  CHECK(dma::fabric_version().find('.') != std::string::npos);
}

TEST_CASE("libfabric discovers a tcp provider with null hints", "[loopback][endpoint]") {
  fi_info* list = nullptr;
  REQUIRE(fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, nullptr, &list) == 0);
  bool tcp = false;
  for (const fi_info* entry = list; entry != nullptr; entry = entry->next) {
    const char* name = entry->fabric_attr->prov_name;
    if (name != nullptr && std::string(name).find("tcp") != std::string::npos) tcp = true;
  }
  fi_freeinfo(list);
  CHECK(tcp);
}

TEST_CASE("an endpoint logs its opening and its replacement to the configuration's handler",
          "[loopback][endpoint][log]") {
  std::vector<std::pair<dma::LogLevel, std::string>> heard;
  std::vector<std::string> process_heard;
  const auto previous = dma::set_log_handler(
      dma::LogHandler([&](dma::LogLevel, std::string_view message) { process_heard.emplace_back(message); }));
  auto configuration = test::loopback_configuration();
  configuration.log_handler = dma::LogHandler(
      [&](dma::LogLevel level, std::string_view message) { heard.emplace_back(level, std::string(message)); });
  dma::Endpoint endpoint;
  endpoint.open(configuration);
  const std::string first_address = dma::encode_hex(endpoint.local_address());
  std::error_code ec;
  auto retired = endpoint.replace_endpoint(ec);
  REQUIRE_FALSE(ec);
  retired.endpoint.reset();  // the endpoint before its CQ
  retired.cq.reset();
  dma::set_log_handler(previous);

  REQUIRE(heard.size() == 2);
  CHECK(heard[0].first == dma::LogLevel::info);
  CHECK(heard[0].second.rfind("endpoint opened: provider tcp", 0) == 0);
  CHECK(heard[0].second.find("address " + first_address) != std::string::npos);
  CHECK(heard[1].first == dma::LogLevel::info);
  CHECK(heard[1].second ==
        "endpoint replaced: address " + first_address + " -> " + dma::encode_hex(endpoint.local_address()));
  CHECK(process_heard.empty());  // the service's handler wins

  // Without a handler of its own, the endpoint logs to the process-wide one.
  process_heard.clear();
  const auto restore = dma::set_log_handler(
      dma::LogHandler([&](dma::LogLevel, std::string_view message) { process_heard.emplace_back(message); }));
  dma::Endpoint plain;
  plain.open(test::loopback_configuration());
  dma::set_log_handler(restore);
  REQUIRE(process_heard.size() == 1);
  CHECK(process_heard[0].rfind("endpoint opened: ", 0) == 0);
}

TEST_CASE("two targets advertise unrelated random keys", "[loopback][endpoint][keys]") {
  asio::io_context io;
  dma::Target first(io, test::loopback_configuration());
  dma::Target second(io, test::loopback_configuration());
  // tcp lets the application choose keys, so these are the ones expose drew.
  constexpr std::size_t count = 64;
  std::vector<std::byte> memory(2 * count * 64);
  std::vector<dma::Target::Region> regions;
  std::vector<std::uint64_t> a, b;
  for (std::size_t i = 0; i < count; ++i) {
    regions.push_back(first.expose(std::span(memory).subspan(2 * i * 64, 64)));
    a.push_back(regions.back().advertisement().remote_key);
    regions.push_back(second.expose(std::span(memory).subspan((2 * i + 1) * 64, 64)));
    b.push_back(regions.back().advertisement().remote_key);
  }
  std::set<std::uint64_t> keys(a.begin(), a.end()), xors, steps;
  keys.insert(b.begin(), b.end());
  CHECK(keys.size() == 2 * count);
  for (std::size_t i = 0; i + 1 < count; ++i) {
    xors.insert(a[i] ^ b[i]);
    steps.insert(a[i + 1] - a[i]);
    steps.insert(b[i + 1] - b[i]);
  }
  CHECK(xors.size() == count - 1);  // no fixed relation between the two targets' keys
  CHECK(steps.size() == 2 * (count - 1));
}
