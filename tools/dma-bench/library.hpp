// The library's side of a point: one service per wait mode and API, opened once and reused across
// points, driven through the awaitable token, a plain completion handler, or the callback service.
#pragma once

#include "setup.hpp"

#include <dma/dma.hpp>

#include <asio/io_context.hpp>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

namespace bench {

class Library {
 public:
  explicit Library(const Setup& setup) : setup_(setup) {}

  /// Opens the service a point needs ahead of time, so setup never counts as transfer cost.
  void prepare(const Point& point);

  /// Runs `point` for the setup's duration through the API it names (not Api::raw).
  Sample run(const Point& point);

  Sample awaitable(const Point& point);
  /// The same service with a plain completion handler that resubmits: no coroutine anywhere.
  Sample handler(const Point& point);
  /// The callback service; its completer resubmits on the fabric thread, keeping `depth` in flight.
  Sample callback(const Point& point);

  /// The engine counters of every service this run opened (printed for --only library).
  void print_metrics() const;

 private:
  dma::asynchronous::FabricService<Slice>& async_service(Wait wait, std::size_t endpoints);
  dma::FabricService<Slice>& callback_service(Wait wait, std::size_t endpoints);
  /// The histogram of the service a point runs on.
  dma::LatencyHistogram latency(const Point& point);
  double run_lanes(Clock::time_point start);
  void submit(dma::FabricService<Slice>& service, int lane);
  void completed(dma::FabricService<Slice>& service, const dma::Completion<Slice>& completion);

  const Setup& setup_;
  asio::io_context io_;
  std::map<std::pair<Wait, std::size_t>, std::unique_ptr<dma::asynchronous::FabricService<Slice>>> async_;
  std::map<std::pair<Wait, std::size_t>, std::unique_ptr<dma::FabricService<Slice>>> callback_;
  std::mutex mutex_;
  std::condition_variable done_;
  Sample sample_;
  Point point_{};
  Clock::time_point end_;
  int lanes_ = 0;
};

}  // namespace bench
