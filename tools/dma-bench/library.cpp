#include "library.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

namespace bench {

void Library::prepare(const Point& point) {
  if (point.api == Api::callback) {
    (void)callback_service(point.wait, point.endpoints);
  } else {
    (void)async_service(point.wait, point.endpoints);
  }
}

Sample Library::run(const Point& point) {
  const dma::LatencyHistogram before = latency(point);
  Sample sample;
  switch (point.api) {
    case Api::callback:
      sample = callback(point);
      break;
    case Api::handler:
      sample = handler(point);
      break;
    case Api::awaitable:
    case Api::raw:
      sample = awaitable(point);
      break;
  }
  // What the service's own histogram saw during this run: the buckets' growth.
  const dma::LatencyHistogram after = latency(point);
  std::array<std::uint64_t, dma::LatencyHistogram::bucket_count> grown{};
  for (std::size_t i = 0; i < grown.size(); ++i)
    grown[i] = after.bucket(i) - before.bucket(i);
  const auto run = dma::LatencyHistogram::from_buckets(grown, after.sum() - before.sum(), after.max());
  if (run.count() != 0) sample.service_p50_us = static_cast<double>(run.p50().count()) / 1e3;
  return sample;
}

dma::LatencyHistogram Library::latency(const Point& point) {
  return point.api == Api::callback ? callback_service(point.wait, point.endpoints).metrics().latency
                                    : async_service(point.wait, point.endpoints).metrics().latency;
}

Sample Library::awaitable(const Point& point) {
  auto& service = async_service(point.wait, point.endpoints);
  Sample sample;
  const auto end = Clock::now() + span_of(setup_.duration);
  const bool latency = point.depth == 1;
  auto lane = [&](int index) -> asio::awaitable<void> {
    while (Clock::now() < end) {
      auto request = request_for(setup_, point, index);
      request.caller_context.started = Clock::now();
      auto [ec, done] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));
      record(sample, done.outcome, done.caller_context.started, latency);
    }
  };
  const auto start = Clock::now();
  for (int i = 0; i < point.depth; ++i)
    asio::co_spawn(io_, lane(i), asio::detached);
  sample.seconds = run_lanes(start);
  return sample;
}

// Runs the io_context until every lane has stopped; seconds since start.
double Library::run_lanes(Clock::time_point start) {
  io_.restart();
  io_.run();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Sample Library::handler(const Point& point) {
  auto& service = async_service(point.wait, point.endpoints);
  Sample sample;
  struct Lane {
    dma::asynchronous::FabricService<Slice>* service;
    Sample* sample;
    const Setup* setup;
    const Point* point;
    Clock::time_point end;
    int index;
    void start() {
      auto request = request_for(*setup, *point, index);
      request.caller_context.started = Clock::now();
      service->submit(std::move(request), [this](std::error_code, dma::Completion<Slice> done) {
        record(*sample, done.outcome, done.caller_context.started, point->depth == 1);
        if (Clock::now() < end) start();
      });
    }
  };
  std::vector<Lane> lanes;
  lanes.reserve(static_cast<std::size_t>(point.depth));
  const auto end = Clock::now() + span_of(setup_.duration);
  const auto start = Clock::now();
  for (int i = 0; i < point.depth; ++i) {
    lanes.push_back(Lane{&service, &sample, &setup_, &point, end, i});
    lanes.back().start();
  }
  sample.seconds = run_lanes(start);
  return sample;
}

Sample Library::callback(const Point& point) {
  auto& service = callback_service(point.wait, point.endpoints);
  std::unique_lock lock(mutex_);
  sample_ = Sample{};
  point_ = point;
  end_ = Clock::now() + span_of(setup_.duration);
  lanes_ = point.depth;
  lock.unlock();
  const auto start = Clock::now();
  for (int i = 0; i < point.depth; ++i)
    submit(service, i);
  lock.lock();
  done_.wait(lock, [&] { return lanes_ == 0; });
  sample_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return sample_;
}

void Library::print_metrics() const {
  auto line = [](const std::string& name, const dma::Metrics& m) {
    std::fprintf(stderr,
                 "%-18s posted %llu, cq_reads %llu, fd_wakeups %llu, spin_hits %llu, armed_late %llu, "
                 "eagain %llu, backstop_hits %llu, joined_pass %llu\n",
                 name.c_str(), static_cast<unsigned long long>(m.posted), static_cast<unsigned long long>(m.cq_reads),
                 static_cast<unsigned long long>(m.fd_wakeups), static_cast<unsigned long long>(m.spin_hits),
                 static_cast<unsigned long long>(m.armed_late), static_cast<unsigned long long>(m.eagain),
                 static_cast<unsigned long long>(m.backstop_hits), static_cast<unsigned long long>(m.joined_pass));
  };
  for (const auto& [key, service] : async_)
    line("async " + std::string(to_string(key.first)) + " x" + std::to_string(key.second) + ":", service->metrics());
  for (const auto& [key, service] : callback_)
    line("callback " + std::string(to_string(key.first)) + " x" + std::to_string(key.second) + ":", service->metrics());
}

dma::asynchronous::FabricService<Slice>& Library::async_service(Wait wait, std::size_t endpoints) {
  auto& slot = async_[{wait, endpoints}];
  if (!slot) {
    slot = std::make_unique<dma::asynchronous::FabricService<Slice>>(io_, setup_.configuration(wait, endpoints));
  }
  return *slot;
}

dma::FabricService<Slice>& Library::callback_service(Wait wait, std::size_t endpoints) {
  auto& slot = callback_[{wait, endpoints}];
  if (!slot) {
    // The completer runs on the fabric thread: it holds its own map entry (whose address never
    // changes) rather than looking it up while this thread may be inserting another.
    auto* service = &slot;
    slot = dma::FabricService<Slice>::start(
        setup_.configuration(wait, endpoints),
        [this, service](std::span<dma::Completion<Slice>> batch) {
          for (auto& completion : batch)
            completed(**service, completion);
        },
        nullptr);
  }
  return *slot;
}

void Library::submit(dma::FabricService<Slice>& service, int lane) {
  auto request = request_for(setup_, point_, lane);
  request.caller_context.started = Clock::now();
  (void)service.submit(std::move(request));
}

void Library::completed(dma::FabricService<Slice>& service, const dma::Completion<Slice>& completion) {
  const auto lane = static_cast<int>((completion.caller_context.bytes.data() - setup_.local.data()) /
                                     static_cast<std::ptrdiff_t>(point_.size));
  record(sample_, completion.outcome, completion.caller_context.started, point_.depth == 1);
  if (Clock::now() < end_) return submit(service, lane);
  std::lock_guard lock(mutex_);
  if (--lanes_ == 0) done_.notify_all();
}

}  // namespace bench
