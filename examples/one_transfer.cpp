// One ToPeer write of 4096 bytes of 0xab with the callback FabricService and a BatchCompleter.
//   one_transfer <bind> [<address-hex> <rkey> <remote-addr>]   (tcp)
//   one_transfer --efa [<address-hex> <rkey> <remote-addr>]     (efa-direct)
#include <cstdio>
#include <future>
#include <memory>
#include <vector>

#include "common.hpp"

struct Operation {
  std::vector<std::uint8_t> payload;
  std::shared_ptr<std::promise<dma::Outcome>> done;
  std::span<const std::uint8_t> source() const { return payload; }
};

int main(int argc, char** argv) {
  examples::CommandLine command_line("one_transfer",
                                     "One ToPeer write of 4096 bytes of 0xab with the callback FabricService.",
                                     "[<bind>] [<address-hex> <rkey> <remote-addr>]");
  if (const auto exit = command_line.parse(argc, argv)) return *exit;
  return examples::run_main([&] {
    const auto arguments = command_line.initiator();
    std::shared_ptr<dma::Pool> pool;
    try {
      pool = std::make_shared<dma::Pool>(2);
    } catch (const std::exception& error) {
      throw examples::Failure(std::string("fabric error: pool: ") + error.what());
    }
    auto service = dma::FabricService<Operation>::start(
        arguments.configuration,
        [](std::span<dma::Completion<Operation>> batch) {
          for (auto& completion : batch)
            completion.caller_context.done->set_value(completion.outcome);
        },
        pool);
    std::printf("local address: %s\n", dma::encode_hex(service->local_address()).c_str());
    std::fflush(stdout);
    const auto peer = examples::peer_or_prompt(arguments);

    auto done = std::make_shared<std::promise<dma::Outcome>>();
    auto outcome = done->get_future();
    dma::TransferRequest<Operation> request;
    request.client_id = 1;
    request.set_peer(peer);
    request.direction = dma::Direction::ToPeer;
    request.want_checksum = true;
    request.caller_context = Operation{std::vector<std::uint8_t>(4096, 0xab), done};
    if (service->submit(std::move(request))) throw examples::Failure("fabric error: fabric worker is gone");

    try {
      const auto result = outcome.get();
      if (result) {
        std::printf("wrote %zu bytes, crc %s\n", result->bytes, examples::crc_text(result->checksum).c_str());
      } else {
        std::printf("transfer failed: %s\n", result.message().c_str());
      }
    } catch (const std::future_error&) {
      std::printf("worker exited without completing the transfer\n");
    }
    return 0;
  });
}
