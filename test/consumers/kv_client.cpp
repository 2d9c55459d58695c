// An outside project's side-channel client: dma::kv::Client over tcp on 127.0.0.1 against any
// server of the protocol (dma-kv-server, or redis-server / Valkey with dma-module.so): DMA.HELLO,
// a 1 MiB DMA.SET from a plain span and a DMA.GET of it into an exposed region, checked byte for
// byte. CI builds it against an installed dma-libfabric (pkg-config and CMake).
//   kv_client PORT
#include <dma/dma.hpp>
#include <dma/kv/client.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr auto with_error = dma::compat::as_tuple(asio::use_awaitable);

asio::awaitable<int> store_and_fetch(dma::kv::Client& client, dma::TargetThread& target, std::uint16_t port) {
  if (auto [ec] = co_await client.async_connect("127.0.0.1", port, with_error); ec) {
    std::fprintf(stderr, "connect: %s\n", ec.message().c_str());
    co_return 1;
  }
  if (auto [ec, hello] = co_await client.async_hello(with_error); ec) {
    std::fprintf(stderr, "%s\n", hello.detail.c_str());
    co_return 1;
  }
  std::vector<std::byte> value(1 << 20);
  for (std::size_t i = 0; i < value.size(); ++i)
    value[i] = static_cast<std::byte>(i * 131 + i / 4096);
  if (auto [ec, set] = co_await client.async_set("consumer:1MiB", value, with_error); ec) {
    std::fprintf(stderr, "%s\n", set.detail.c_str());
    co_return 1;
  }
  std::vector<std::byte> back(2 << 20);
  const dma::Target::Region region = target.expose(back);
  auto [ec, got] = co_await client.async_get("consumer:1MiB", region, back, with_error);
  if (ec) {
    std::fprintf(stderr, "%s\n", got.detail.c_str());
    co_return 1;
  }
  const bool same = got.length == value.size() && std::equal(value.begin(), value.end(), back.begin());
  std::printf("%s 1 MiB through the side channel on port %u: %s (crc32c %u)\n",
              same ? "stored and read back" : "MISMATCH:", static_cast<unsigned>(port),
              same ? "byte-exact" : "the bytes differ", static_cast<unsigned>(got.crc));
  co_return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kv_client PORT\n");
    return 2;
  }
  const auto port = static_cast<std::uint16_t>(std::atoi(argv[1]));
  dma::Configuration configuration;
  configuration.bind = "127.0.0.1";
  auto target = dma::TargetThread::start(configuration);
  dma::kv::ClientTarget shared(target->target());
  asio::io_context io;
  dma::kv::Client client(io, shared);
  int status = 1;
  asio::co_spawn(io, store_and_fetch(client, *target, port), [&](std::exception_ptr error, int result) {
    if (error) std::rethrow_exception(error);
    status = result;
  });
  io.run();
  return status;
}
