// The RESP parsers' invariants on arbitrary input, shared by the randomised unit test and the
// libFuzzer target (resp_fuzz.cpp).
#pragma once

#include <dma/kv/resp.hpp>

#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

namespace side_channel_test {

// Aborts on a broken invariant, so libFuzzer and the unit test both see it.
inline void require(bool condition) {
  if (!condition) std::abort();
}

/// Parses input as a stream of requests and, separately, of replies, as a connection would.
inline void fuzz_resp(std::span<const std::uint8_t> data) {
  const std::string_view input(reinterpret_cast<const char*>(data.data()), data.size());
  dma::kv::resp::Limits limits;
  limits.max_inline = 256;
  limits.max_arguments = 8;
  limits.max_bulk = 1024;
  limits.max_request = 2048;
  std::vector<std::string_view> arguments;
  std::size_t at = 0;
  for (int i = 0; i < 10000 && at < input.size(); ++i) {
    const auto rest = input.substr(at);
    const auto parsed = dma::kv::resp::parse_request(rest, limits, arguments);
    if (parsed.status != dma::kv::resp::Status::complete) {
      require(arguments.empty());
      require(parsed.consumed == 0);
      if (parsed.status == dma::kv::resp::Status::incomplete) {
        require(rest.size() <= limits.max_request + limits.max_inline + 1024);
        require(parsed.needed == 0 || parsed.needed > rest.size());
      }
      break;
    }
    require(parsed.consumed > 0 && parsed.consumed <= rest.size());
    require(arguments.size() <= limits.max_arguments);
    for (const auto argument : arguments) {
      require(argument.data() >= rest.data() && argument.data() + argument.size() <= rest.data() + parsed.consumed);
      require(argument.size() <= std::max(limits.max_bulk, limits.max_inline));
    }
    at += parsed.consumed;
  }
  dma::kv::resp::Reply reply;
  const auto parsed = dma::kv::resp::parse_reply(input, limits, reply);
  if (parsed.status == dma::kv::resp::Status::complete) require(parsed.consumed > 0 && parsed.consumed <= input.size());
}

}  // namespace side_channel_test
