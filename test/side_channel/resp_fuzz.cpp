// libFuzzer target for the RESP parsers (clang only; not part of the Meson build):
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iexamples/side_channel \
//     test/side_channel/resp_fuzz.cpp examples/side_channel/resp.cpp -o resp-fuzz && ./resp-fuzz -max_total_time=60
#include "resp_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  side_channel_test::fuzz_resp(std::span<const std::uint8_t>(data, size));
  return 0;
}
