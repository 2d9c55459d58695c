// dma-bench's vocabulary: what one measured point is, and what one run of it measured.
#pragma once

#include <dma/configuration.hpp>
#include <dma/transfer.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;

/// The side measured against the raw loop: one of the library's APIs, or the raw loop itself on a
/// second endpoint (the A/A control of the harness).
enum class Api { awaitable, handler, callback, raw };

/// The wait modes on the command line: fd, adaptive, busy.
enum class Wait { fd, adaptive, busy };

std::string_view to_string(Api api) noexcept;
std::string_view to_string(Wait wait) noexcept;
std::string_view to_string(dma::Direction direction) noexcept;  ///< "write" or "read"
std::optional<Api> api_from(std::string_view name) noexcept;
std::optional<Wait> wait_from(std::string_view name) noexcept;
std::optional<dma::Direction> direction_from(std::string_view name) noexcept;
dma::WaitMode wait_mode(Wait wait) noexcept;
Wait wait_of(dma::WaitMode mode) noexcept;

/// A transfer size: a positive count of bytes with an optional suffix B, K/KiB, M/MiB or G/GiB
/// (powers of 1024), at most 1 GiB; nullopt for anything else.
std::optional<std::size_t> parse_size(std::string_view text) noexcept;
/// The shortest exact spelling parse_size() reads back: 64, 4K, 1M.
std::string size_text(std::size_t bytes);

struct Point {
  Api api = Api::awaitable;
  dma::Direction direction = dma::Direction::ToPeer;
  std::size_t size = 0;
  int depth = 1;
  Wait wait = Wait::fd;
  std::size_t endpoints = 1;  ///< the library's (--endpoints); the raw loop always has one
};

/// One timed run of one side at one point.
struct Sample {
  double seconds = 0;
  std::uint64_t transfers = 0;
  std::uint64_t errors = 0;
  double cpu_initiator = 0;
  double cpu_target = 0;
  std::uint64_t target_sleeps = 0;  ///< times the target's progress thread slept during the run
  std::vector<double> latencies_us;
  double service_p50_us = 0;  ///< the median of the service's own latency histogram over the run (0: none)
};

}  // namespace bench
