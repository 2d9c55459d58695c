// Must not compile: a context that supplies no operand (its member is misspelt) is refused where
// the service is named, with an error that names dma::TransferContext.
#include <dma/dma.hpp>

#include <asio/io_context.hpp>

#include <span>

struct Misspelt {
  std::span<const std::byte> sorce() const { return {}; }
};

int main() {
  asio::io_context io;
  dma::asynchronous::FabricService<Misspelt> service(io.get_executor());
  (void)service;
}
