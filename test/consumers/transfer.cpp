// An outside project's first program: a Target and an asynchronous FabricService in one process
// over tcp on 127.0.0.1, one 64 KiB write and one read back, both checked byte for byte. CI
// builds it against an installed dma-libfabric (pkg-config, CMake, Meson subproject). It includes
// Asio first, as a program may: the package's compile arguments must configure Asio as the
// library's units are (aligned_alloc for its handlers; docs/design.md, "What the library exports").
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>

#include <dma/dma.hpp>
#include <dma/version.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

#if defined(_GLIBCXX_HAVE_ALIGNED_ALLOC) && !defined(ASIO_HAS_STD_ALIGNED_ALLOC)
#error "Asio, included first, allocates its handlers with operator new; the library uses aligned_alloc"
#endif

namespace {

struct Buffer {
  std::vector<std::byte> bytes;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t n) {
    bytes.resize(n);
    return bytes;
  }
};

// Runs io until the future is ready, for at most 20 s.
template <typename T>
T wait_for(asio::io_context& io, std::future<T>& future) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (std::chrono::steady_clock::now() >= deadline) throw std::runtime_error("no completion within 20 s");
    io.restart();
    io.run_for(std::chrono::milliseconds(10));
  }
  return future.get();
}

}  // namespace

int main() {
  try {
    std::printf("dma-libfabric %s (headers %s), libfabric %s\n", std::string(dma::version()).c_str(),
                DMA_VERSION_STRING, dma::fabric_version().c_str());
    dma::Configuration configuration;
    configuration.bind = "127.0.0.1";

    auto target = dma::TargetThread::start(configuration);  // the peer, progressed on its own thread
    std::vector<std::byte> remote(65536, std::byte{0});
    const auto region = target->expose(remote);

    asio::io_context io;
    dma::asynchronous::FabricService<Buffer> service(io, configuration);
    dma::TransferRequest<Buffer> write;
    write.set_peer(region.advertisement());
    write.direction = dma::Direction::ToPeer;
    write.caller_context.bytes.resize(remote.size());
    for (std::size_t i = 0; i < remote.size(); ++i)
      write.caller_context.bytes[i] = static_cast<std::byte>(i * 7 + 1);
    const auto sent = write.caller_context.bytes;
    auto written = service.submit(std::move(write), asio::use_future);
    const auto write_done = wait_for(io, written);

    dma::TransferRequest<Buffer> read;
    read.set_peer(region.advertisement());
    read.direction = dma::Direction::FromPeer;
    read.length = remote.size();
    auto read_back = service.submit(std::move(read), asio::use_future);
    const auto read_done = wait_for(io, read_back);

    target->pause();
    if (!write_done.outcome || !read_done.outcome) {
      std::fprintf(stderr, "transfer failed: %s\n",
                   (!write_done.outcome ? write_done.outcome : read_done.outcome).message().c_str());
      return 1;
    }
    if (remote != sent || read_done.caller_context.bytes != sent) {
      std::fprintf(stderr, "the bytes that landed differ from the bytes sent\n");
      return 1;
    }
    std::printf("wrote and read back %zu bytes over %s: verified\n", sent.size(), service.describe().provider.c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
