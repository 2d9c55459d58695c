// Must not compile: an lvalue request would silently copy the caller's context and payload.
#include <dma/dma.hpp>

#include <asio/io_context.hpp>

#include <system_error>
#include <vector>

int main() {
  asio::io_context io;
  dma::asynchronous::FabricService<std::vector<std::byte>> service(io.get_executor());
  dma::TransferRequest<std::vector<std::byte>> request;
  service.submit(request, [](std::error_code, dma::Completion<std::vector<std::byte>>) {});
}
