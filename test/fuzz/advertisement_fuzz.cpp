// libFuzzer target: the advertisement parser and the address validator on untrusted bytes. Any
// input must give an Advertisement or an error code, never a crash, a hang or a leak; and what
// parses must survive a round trip through to_string().
#include <dma/advertisement.hpp>

#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::error_code ec;
  const auto parsed = dma::Advertisement::parse(text, ec);
  if (ec) return 0;
  for (const std::uint32_t format : {FI_SOCKADDR_IN, FI_SOCKADDR_IN6, FI_ADDR_EFA})
    (void)dma::validate_address(parsed.address, format);
  if (parsed.address.empty()) return 0;
  std::error_code again;
  if (!(dma::Advertisement::parse(parsed.to_string(), again) == parsed) || again) std::abort();
  return 0;
}
