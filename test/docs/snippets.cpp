// The code fragments of docs/getting-started.md, docs/configuration.md and docs/cluster.md, each inside a function
// that gives it the context the guide describes, so that they compile. test/docs/check_docs.py
// checks that every fragment the guides show appears here (or in the file the guide names).
#include <dma/dma.hpp>
#include <dma/kv/cluster_client.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <cstdint>
#include <cstdio>
#include <future>
#include <span>
#include <string>
#include <vector>

namespace snippets {

using Bytes = std::vector<std::uint8_t>;

struct Gather {
  std::vector<std::span<const std::byte>> parts;  // header, body, trailer: written back to back
  std::span<const std::span<const std::byte>> sources() const { return parts; }
};

void gather(dma::asynchronous::FabricService<Gather>& service, const dma::Advertisement& peer,
            std::span<const std::byte> header, std::span<const std::byte> body) {
  dma::TransferRequest<Gather> request;
  request.client_id = 7;
  request.set_peer(peer);
  request.caller_context.parts = {header, body};
  service.submit(std::move(request), [](std::error_code, dma::Completion<Gather>) {});
}

void expose(const dma::Configuration& configuration) {
  asio::io_context target_io;
  dma::Target target(target_io, configuration);           // throws std::system_error
  std::vector<std::byte> buffer(1 << 20);                 // must outlive the Region
  dma::Target::Region region = target.expose(buffer);     // Access::read_write by default
  std::string text = region.advertisement().to_string();  // "<address-hex> <rkey> <remote-addr>"
}

void parse(const std::string& text) {
  dma::Advertisement peer = dma::Advertisement::parse(text);  // throws std::system_error

  std::error_code ec;
  dma::Advertisement maybe = dma::Advertisement::parse(text, ec);
  if (ec == dma::condition::invalid_advertisement) {
    // reject the client
  }
}

void process_settings() {
  if (!dma::set_process_settings(dma::ProcessSettings{.slim_buffers = false})) {
    // too late: an endpoint is already open, and the settings in force stay
  }
}

void configuration_from_file() {
  auto configuration = dma::Configuration::from_toml("config/tcp.toml");  // throws dma::ConfigurationError
}

void open(const dma::Configuration& configuration) {
  asio::io_context io;
  dma::asynchronous::FabricService<Bytes> service(io, configuration);  // throws std::system_error
}

struct Upload {  // writes only
  std::vector<std::uint8_t> payload;
  std::span<const std::uint8_t> source() const { return payload; }
};

struct Slice {  // both directions, memory owned elsewhere
  std::span<std::byte> bytes;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t) { return bytes; }
};

using Service = dma::asynchronous::FabricService<Bytes>;
using TupleService = dma::compat::as_tuple_t<asio::use_awaitable_t<>>::as_default_on_t<Service>;

asio::awaitable<void> submit(Service& service, dma::TransferRequest<Bytes> request, dma::TransferRequest<Bytes> other) {
  auto [ec, completion] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));
  dma::Completion<Bytes> done = co_await service.submit(std::move(other));  // throws on failure
}

struct MyContext {
  std::span<std::byte> buffer;
  std::span<const std::byte> source() const { return buffer; }
};

dma::TransferRequest<MyContext> make_request(MyContext context) {
  dma::TransferRequest<MyContext> request;
  request.caller_context = context;
  return request;
}

asio::awaitable<void> named_request(dma::asynchronous::FabricService<MyContext>& service, std::span<std::byte> buffer) {
  auto request = make_request(MyContext{buffer});
  auto completion = co_await service.submit(std::move(request));
}

void check(const dma::Completion<Bytes>& completion) {
  const dma::Outcome& outcome = completion.outcome;
  if (outcome.ok()) {                                      // or: if (outcome)
    std::size_t bytes = outcome->bytes;                    // TransferDone
    std::optional<std::uint32_t> crc = outcome->checksum;  // set when want_checksum
  } else if (outcome.error() == std::errc::timed_out) {
    // not done within its deadline (Configuration::transfer_deadline or request.deadline)
  } else if (outcome.error() == dma::condition::connection_lost) {
    // the connection broke under it: the peer died, or rejected it (a wrong key or range)
  } else if (outcome.error() == dma::condition::peer_unreachable) {
    // refused, never connected within progress_deadline, or backing off after that
  } else if (outcome.error() == dma::errc::shutdown) {
    // the service closed first
  } else if (outcome.error() == asio::error::operation_aborted) {
    // you cancelled it
  }
  std::string text = outcome.message();  // "ok", or the error's message plus provider detail
  int prov = outcome.provider_errno();   // the provider's errno of an error completion, else 0
}

asio::awaitable<void> tokens(Service& service, dma::TransferRequest<Bytes> request) {
  // Callback. Runs on the service's executor unless the handler has an associated executor.
  service.submit(std::move(request), [](std::error_code, dma::Completion<Bytes> completion) { /* ... */ });

  // Future. Call get() from a thread that is not running `io`; it throws std::system_error on failure.
  std::future<dma::Completion<Bytes>> future = service.submit(std::move(request), asio::use_future);

  // Deferred. Nothing starts until the operation is invoked with a token.
  auto operation = service.submit(std::move(request), dma::compat::deferred);
  std::move(operation)([](std::error_code, dma::Completion<Bytes> completion) { /* ... */ });

  // as_tuple. The error and the completion, in a std::tuple.
  auto [ec, completion] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));

  // redirect_error. The error goes to `error`; the completion is returned either way.
  std::error_code error;
  dma::Completion<Bytes> done =
      co_await service.submit(std::move(request), asio::redirect_error(asio::use_awaitable, error));
}

void cancel(Service& service, dma::TransferRequest<Bytes> request) {
  asio::cancellation_signal signal;
  service.submit(std::move(request),
                 asio::bind_cancellation_slot(signal.slot(),
                                              [](std::error_code, dma::Completion<Bytes> completion) { /* ... */ }));
  signal.emit(asio::cancellation_type::terminal);
}

asio::awaitable<void> immediate_data(Service& service, dma::TransferRequest<Bytes> request) {
  request.immediate_data = 42;  // the target's async_wait_written hears 42 once the bytes have landed
  auto completion = co_await service.submit(std::move(request));
}

asio::awaitable<void> wait_written(dma::Target& target) {
  auto [ec, notification] = co_await target.async_wait_written(dma::compat::as_tuple(asio::use_awaitable));
  if (ec == dma::errc::notifications_lost) {
    // the queue was full: notification.data notifications were dropped here
  } else if (!ec) {
    std::uint64_t value = notification.data;             // the writer's immediate_data
    std::optional<std::size_t> n = notification.length;  // none on tcp, which does not report it
  }
}

void notification_callback(dma::Target& target) {
  target.set_notification_callback([](std::error_code ec, dma::WriteNotification notification) { /* ... */ });
}

asio::awaitable<void> completion_level(Service& service, dma::TransferRequest<Bytes> request) {
  request.completion = dma::CompletionLevel::transmit;  // done once the local buffer is free again
  auto completion = co_await service.submit(std::move(request));
}

asio::awaitable<void> peers(Service& service, const dma::Advertisement& peer) {
  co_await service.add_peer(1, peer.address);  // throws std::system_error on a bad address
  auto [ec] = co_await service.add_peer(1, peer.address, dma::compat::as_tuple(asio::use_awaitable));

  service.remove_peer(1);  // returns at once
}

asio::awaitable<void> connect_first(Service& service, const dma::Advertisement& peer) {
  co_await service.add_peer(1, peer);  // the connection is up: the first transfer does not set it up
}

void command_line(const std::string& config_path, const std::string& bind_from_command_line) {
  dma::Configuration configuration;  // the defaults
  if (!config_path.empty()) configuration = dma::Configuration::from_toml(config_path);
  configuration.bind = bind_from_command_line;  // command-line options then override the file
}

void logging(dma::Configuration& configuration, std::vector<std::string>& my_log) {
  // Every service and target of the process, from warnings up, on stderr:
  dma::set_log_handler(dma::log_to_stderr(dma::LogLevel::warning));

  // Or one service's messages to a function of its own (it wins over the process-wide handler):
  configuration.log_handler = dma::LogHandler(
      [&my_log](dma::LogLevel level, std::string_view message) {
        my_log.push_back(std::string(dma::to_string(level)) + ": " + std::string(message));
      },
      dma::LogLevel::info);

  dma::set_log_handler({});  // silent again (the default)
}

void latency(const Service& service) {
  const dma::Metrics metrics = service.metrics();
  const dma::LatencyHistogram& latency = metrics.latency;  // successful transfers
  std::printf("%llu transfers, p50 %lld ns, p99 %lld ns\n", static_cast<unsigned long long>(latency.count()),
              static_cast<long long>(latency.p50().count()), static_cast<long long>(latency.p99().count()));
}

std::string scrape(const Service& a, const Service& b) {
  // One page, two services: a prefix each, so every metric name has one HELP and one TYPE line.
  return dma::to_prometheus(a.metrics(), "dma_a_") + dma::to_prometheus(b.metrics(), "dma_b_");
}

dma::LatencyHistogram both(const Service& a, const Service& b) {
  dma::LatencyHistogram latency = a.metrics().latency;
  latency += b.metrics().latency;  // histograms add up
  return latency;
}

asio::awaitable<void> cluster(dma::kv::ClientTarget& shared, std::span<std::byte> buffer,
                              const dma::Target::Region& region) {
  dma::kv::ClusterOptions options;
  options.client.deadline = std::chrono::seconds(30);  // a whole command, retries included
  dma::kv::ClusterClient cluster(co_await asio::this_coro::executor, shared, options);
  co_await cluster.async_connect("10.0.0.5", 7000);  // any node: the slot map comes from it

  dma::kv::SetRequest set{"user:42", buffer.first(4096), &region, {}};
  set.replicas = 1;  // OK only once a replica holds it too (WAIT 1)
  set.replica_timeout = std::chrono::milliseconds(500);
  dma::kv::SetResult stored = co_await cluster.async_set(set);  // throws std::system_error

  auto [ec, got] = co_await cluster.async_get(dma::kv::GetRequest{"user:42", buffer, &region, {}},
                                              dma::compat::as_tuple(asio::use_awaitable));
  if (ec == dma::kv::client_error::no_such_key) std::printf("not there: %s\n", got.detail.c_str());
}

}  // namespace snippets
