// The passive peer: exposes 4096 bytes, prints its advertisement, and waits for a transfer.
//   one_target [--read] <bind> [<initiator-address-hex>]     (tcp)
//   one_target [--read] --efa [<initiator-address-hex>]       (efa-direct: insert the initiator first)
#include "common.hpp"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace {

bool all_ab(const std::vector<std::byte>& buffer) {
  return std::all_of(buffer.begin(), buffer.end(), [](std::byte b) { return b == std::byte{0xab}; });
}

// Decimal, as the initiators print theirs (`crc Some(2486649235)`), so the two can be compared.
std::string crc_text(const std::vector<std::byte>& buffer) { return std::to_string(dma::checksum(buffer)); }

}  // namespace

int main(int argc, char** argv) {
  examples::CommandLine command_line(
      "one_target", "The passive peer: exposes 4096 bytes, prints its advertisement, and waits for a transfer.",
      "[<bind>] [<initiator-address-hex>] (with --efa: [<initiator-address-hex>])");
  bool read = false;
  command_line.app().add_flag("--read", read,
                              "serve 4096 bytes of 0xab for a remote read instead of waiting for a write");
  command_line.app().footer(
      "tcp:        one_target [--read] <bind> [<initiator-address-hex>]\n"
      "efa-direct: one_target [--read] --efa [<initiator-address-hex>]\n"
      "With --config FILE whose table sets bind, <bind> may be left out when no address follows.");
  if (const auto exit = command_line.parse(argc, argv)) return *exit;
  return examples::run_main([&] {
    dma::Configuration configuration = command_line.configuration();  // --config, --efa
    const auto& positionals = command_line.positionals();
    std::size_t next = 0;
    if (!command_line.uses_efa() && next < positionals.size()) configuration.bind = positionals[next++];

    // One thread runs the target's progress and checks the buffer, so the check never races the
    // provider writing into it.
    asio::io_context io;
    dma::Target target(io, configuration);
    if (next < positionals.size()) target.insert_initiator(dma::decode_hex(positionals[next]));

    std::vector<std::byte> buffer(4096, read ? std::byte{0xab} : std::byte{0});
    const auto region = target.expose(buffer);
    std::printf("advertisement: %s\n", region.advertisement().to_string().c_str());
    if (read) {
      std::printf("serving 4096 bytes of 0xab for a remote read, crc %s — the initiator verifies\n",
                  crc_text(buffer).c_str());
    } else {
      std::printf("waiting for a transfer into 4096 bytes...\n");
    }
    std::fflush(stdout);

    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    bool received = false;
    asio::steady_timer tick(io);
    std::function<void()> check = [&] {
      if (!read && all_ab(buffer)) {
        std::printf("received 4096 bytes, crc %s — payload verified\n", crc_text(buffer).c_str());
        received = true;
        return io.stop();
      }
      if (std::chrono::steady_clock::now() >= deadline) return io.stop();
      tick.expires_after(std::chrono::milliseconds(1));
      tick.async_wait([&](std::error_code) { check(); });
    };
    check();
    io.run();
    if (received || read) return 0;
    throw examples::Failure("timed out waiting for a transfer");
  });
}
