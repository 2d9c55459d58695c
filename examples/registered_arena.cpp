// A payload inside a pre-registered MemoryRegion: slot 1 of a 64 x 4096-byte arena, written with
// the callback FabricService. Operands inside the region skip per-transfer registration.
//   registered_arena <bind> [<address-hex> <rkey> <remote-addr>]   (tcp)
//   registered_arena --efa [<address-hex> <rkey> <remote-addr>]     (efa-direct)
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "common.hpp"

using Arena = std::vector<std::byte>;

// One transfer's context: a slice of the arena, holding a copy of the region so the storage stays
// alive until the completion comes back.
struct Slot {
  dma::MemoryRegion<Arena> region;
  std::size_t at = 0;
  std::size_t length = 0;
  std::shared_ptr<std::promise<dma::Outcome>> done;

  std::optional<std::span<const std::byte>> source() const {
    if (at > region.length() || length > region.length() - at) return std::nullopt;
    return std::span<const std::byte>(region.bytes().subspan(at, length));
  }
};

int main(int argc, char** argv) {
  examples::CommandLine command_line(
      "registered_arena", "A write of slot 1 of a pre-registered 64 x 4096-byte arena with the callback FabricService.",
      "[<bind>] [<address-hex> <rkey> <remote-addr>]");
  if (const auto exit = command_line.parse(argc, argv)) return *exit;
  return examples::run_main([&] {
    const auto arguments = command_line.initiator();
    auto pool = std::make_shared<dma::Pool>(2);
    auto service = dma::FabricService<Slot>::start(
        arguments.configuration,
        [](std::span<dma::Completion<Slot>> batch) {
          for (auto& completion : batch)
            completion.caller_context.done->set_value(completion.outcome);
        },
        pool);
    std::printf("local address: %s\n", dma::encode_hex(service->local_address()).c_str());

    Arena arena(64 * 4096, std::byte{0});
    std::fill(arena.begin() + 4096, arena.begin() + 8192, std::byte{0xab});
    auto region = service->register_region(std::move(arena));
    std::printf("registered %zu bytes\n", region.length());
    std::fflush(stdout);
    const auto peer = examples::peer_or_prompt(arguments);

    auto done = std::make_shared<std::promise<dma::Outcome>>();
    auto outcome = done->get_future();
    dma::TransferRequest<Slot> request;
    request.client_id = 1;
    request.set_peer(peer);
    request.direction = dma::Direction::ToPeer;
    request.want_checksum = true;
    request.caller_context = Slot{region, 4096, 4096, done};
    if (service->submit(std::move(request))) throw examples::Failure("fabric error: fabric worker is gone");

    try {
      const auto result = outcome.get();
      if (result) {
        std::printf("wrote %zu bytes from the arena, crc %s\n", result->bytes,
                    examples::crc_text(result->checksum).c_str());
      } else {
        std::printf("transfer failed: %s\n", result.message().c_str());
      }
    } catch (const std::future_error&) {
      std::printf("the worker exited before the transfer completed\n");
    }
    return 0;  // dropping `region` retires the registration, then frees the arena
  });
}
