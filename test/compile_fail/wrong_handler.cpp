// Must not compile: a completion handler that does not take submit()'s signature,
// void(std::error_code, dma::Completion<Context>), is refused with an error that names
// asio::completion_token_for.
#include <dma/dma.hpp>

#include <asio/io_context.hpp>

#include <vector>

int main() {
  asio::io_context io;
  dma::asynchronous::FabricService<std::vector<std::byte>> service(io.get_executor());
  dma::TransferRequest<std::vector<std::byte>> request;
  service.submit(std::move(request), [](dma::Completion<std::vector<std::byte>>) {});
}
