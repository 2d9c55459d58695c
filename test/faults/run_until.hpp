// Drives an io_context until a condition holds, bounded in time: the fault tests' wait.
#pragma once

#include <asio/io_context.hpp>

#include <chrono>
#include <functional>

namespace test {

/// Runs io in 5 ms slices until pred holds or the bound passes; returns whether pred held.
inline bool run_until(asio::io_context& io, const std::function<bool()>& pred, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    io.restart();
    io.run_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace test
