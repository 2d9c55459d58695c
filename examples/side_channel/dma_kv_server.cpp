// dma-kv-server: a RESP2 key-value server whose large values travel through a one-sided side
// channel. A client says DMA.HELLO with its fabric address, then DMA.SET makes the server read a
// value out of the client's registered buffer and DMA.GET makes it write one in; PING, SET, GET
// and DEL work inline, so redis-cli shares the same store. See docs/side-channel.md.
//   dma-kv-server [--port P] [--threads N] [--max-value BYTES] [--max-memory BYTES] ...
#include <dma/dma.hpp>

#include "fabric_host.hpp"
#include "resp.hpp"
#include "store.hpp"

#include <CLI/CLI.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using asio::ip::tcp;
using namespace std::chrono_literals;
constexpr auto tuple_awaitable = dma::compat::as_tuple(asio::use_awaitable);

struct Options {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 6380;
  unsigned threads = 1;
  bool efa = false;
  std::size_t max_value = std::size_t{16} << 20;
  std::size_t max_memory = std::size_t{1} << 30;
  std::size_t max_clients = 1024;
  bool allow_any_fabric_host = false;
  std::string config;                      // a TOML file's [dma-libfabric] table, applied first
  std::uint64_t transfer_deadline_ms = 0;  // 0: the configuration's (30 s by default)
};

// One transfer's context: a stored (or arriving) value's region and its length.
struct Slot {
  kv::Region region;
  std::size_t length = 0;
  std::span<const std::byte> source() const { return region.bytes().first(length); }
  std::span<std::byte> allocate(std::size_t n) const { return region.bytes().first(std::min(n, length)); }
};

using Service = dma::asynchronous::FabricService<Slot>;

struct Counters {
  std::atomic<std::uint64_t> connections_total{0};
  std::atomic<std::uint64_t> connections_rejected{0};
  std::atomic<std::uint64_t> commands{0};
  std::atomic<std::uint64_t> error_replies{0};
  std::atomic<std::uint64_t> protocol_errors{0};
  std::atomic<std::uint64_t> hellos{0};
  std::atomic<std::uint64_t> hellos_rejected{0};
  std::atomic<std::uint64_t> transfers_ok{0};
  std::atomic<std::uint64_t> transfers_failed{0};
  std::atomic<std::uint64_t> transfers_timed_out{0};
  std::atomic<std::uint64_t> crc_mismatches{0};
  std::atomic<std::uint64_t> bytes_read{0};      ///< pulled out of clients by DMA.SET
  std::atomic<std::uint64_t> bytes_written{0};   ///< pushed into clients by DMA.GET
  std::atomic<std::uint64_t> dma_clients{0};     ///< connections past DMA.HELLO now
  std::atomic<std::uint64_t> sets_in_flight{0};  ///< DMA.SET transfers submitted and not completed
  std::atomic<std::uint64_t> gets_in_flight{0};
};

// Counts one transfer in flight while it lives.
class InFlight {
 public:
  explicit InFlight(std::atomic<std::uint64_t>& counter) : counter_(counter) { ++counter_; }
  ~InFlight() { --counter_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<std::uint64_t>& counter_;
};

class Connection;

class Server {
 public:
  Server(asio::io_context& io, const Options& options, const dma::Configuration& configuration)
      : io_(io),
        options_(options),
        service_(io, configuration),
        info_(service_.describe()),
        acceptor_(io, tcp::endpoint(asio::ip::make_address(options.bind), options.port)),
        store_(options.max_memory),
        started_(std::chrono::steady_clock::now()) {
    // A bulk somewhat over the value limit still parses, so SET can answer it with an error.
    limits_.max_bulk = options.max_value + 64 * 1024;
    limits_.max_request = limits_.max_bulk + 64 * 1024;
  }

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  asio::awaitable<void> accept();
  asio::awaitable<void> stop();
  std::string info() const;

  asio::io_context& io_;
  const Options options_;
  Service service_;
  const dma::EndpointInfo info_;
  tcp::acceptor acceptor_;
  kv::Store store_;
  kv::resp::Limits limits_;
  Counters counters_;
  std::atomic<std::uint64_t> next_client_id_{1};
  const std::chrono::steady_clock::time_point started_;

  mutable std::mutex connections_mutex_;
  std::set<std::shared_ptr<Connection>> connections_;
};

// One RESP connection, served by one coroutine on its own strand: commands run one at a time, in
// order, each with its transfer awaited before the next is read.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server& server, tcp::socket socket) : server_(server), socket_(std::move(socket)) {
    std::error_code ec;
    peer_ = socket_.remote_endpoint(ec).address();
    socket_.set_option(tcp::no_delay(true), ec);
    buffer_.resize(initial_buffer);
  }

  asio::awaitable<void> run();
  tcp::socket::executor_type executor() { return socket_.get_executor(); }
  /// Closes the socket from any thread; the coroutine then ends after its current command.
  void close() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      std::error_code ec;
      self->socket_.close(ec);
    });
  }

 private:
  static constexpr std::size_t initial_buffer = 16 * 1024;

  bool make_room(std::size_t needed);
  asio::awaitable<bool> execute(std::span<const std::string_view> arguments);
  asio::awaitable<void> hello(std::string_view address_hex);
  asio::awaitable<void> dma_set(std::span<const std::string_view> arguments);
  asio::awaitable<void> dma_get(std::span<const std::string_view> arguments);
  asio::awaitable<void> set_inline(std::string_view key, std::string_view value);
  void get_inline(std::string_view key);
  void error(std::string_view text) {
    ++server_.counters_.error_replies;
    kv::resp::append_error(out_, text);
  }
  void wrong_arity(std::string_view command) {
    std::string name(command);
    for (auto& c : name)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    error("ERR wrong number of arguments for '" + name + "' command");
  }
  /// Counts a finished transfer; true when it succeeded.
  bool account(const dma::Outcome& outcome) {
    if (outcome) {
      ++server_.counters_.transfers_ok;
      return true;
    }
    ++server_.counters_.transfers_failed;
    if (outcome.error() == std::errc::timed_out) ++server_.counters_.transfers_timed_out;
    return false;
  }
  asio::awaitable<bool> flush();

  Server& server_;
  tcp::socket socket_;
  asio::ip::address peer_;
  std::vector<char> buffer_;
  std::size_t begin_ = 0;  ///< first unparsed byte
  std::size_t end_ = 0;    ///< one past the last received byte
  std::string out_;        ///< the reply being built
  kv::Value payload_;      ///< an inline GET's value, written after out_
  std::uint64_t client_id_ = 0;
  dma::PeerAddress fabric_address_;
};

// Moves unparsed bytes to the front, and grows the buffer (up to the largest request) when a
// request needs more room than is left. False when a request would not fit at all.
bool Connection::make_room(std::size_t needed) {
  const std::size_t pending = end_ - begin_;
  if (begin_ > 0 && (end_ == buffer_.size() || begin_ > buffer_.size() / 2)) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, pending);
    begin_ = 0;
    end_ = pending;
  }
  if (pending == 0 && buffer_.size() > (std::size_t{1} << 20)) {
    buffer_.resize(initial_buffer);
    buffer_.shrink_to_fit();
  }
  const std::size_t limit = server_.limits_.max_request + 64 * 1024;
  if (needed > buffer_.size() - begin_ && begin_ + needed <= limit) buffer_.resize(begin_ + needed);
  if (end_ < buffer_.size()) return true;
  if (buffer_.size() >= limit) return false;
  buffer_.resize(std::min(limit, buffer_.size() * 2));
  return true;
}

asio::awaitable<bool> Connection::flush() {
  std::array<asio::const_buffer, 3> buffers{asio::buffer(out_), asio::buffer(payload_.bytes().data(), payload_.length),
                                            asio::buffer("\r\n", payload_.region ? 2 : 0)};
  auto [ec, n] = co_await asio::async_write(socket_, buffers, tuple_awaitable);
  out_.clear();
  payload_ = kv::Value{};
  co_return !ec;
}

asio::awaitable<void> Connection::run() {
  const auto self = shared_from_this();
  std::vector<std::string_view> arguments;
  bool open = true;
  while (open) {
    const auto parsed =
        kv::resp::parse_request(std::string_view(buffer_.data() + begin_, end_ - begin_), server_.limits_, arguments);
    if (parsed.status == kv::resp::Status::complete) {
      begin_ += parsed.consumed;
      if (arguments.empty()) continue;
      ++server_.counters_.commands;
      open = co_await execute(arguments);
      open = co_await flush() && open;
      continue;
    }
    if (parsed.status == kv::resp::Status::error || !make_room(parsed.needed)) {
      ++server_.counters_.protocol_errors;
      error(parsed.status == kv::resp::Status::error ? "ERR " + parsed.error : "ERR Protocol error: request too large");
      co_await flush();
      break;
    }
    auto [ec, n] =
        co_await socket_.async_read_some(asio::buffer(buffer_.data() + end_, buffer_.size() - end_), tuple_awaitable);
    if (ec) break;
    end_ += n;
  }
  std::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  if (client_id_ != 0) {
    server_.service_.remove_peer(client_id_);
    --server_.counters_.dma_clients;
  }
  std::lock_guard lock(server_.connections_mutex_);
  server_.connections_.erase(self);
}

// Runs one command, leaving its reply in out_ (and payload_); false when the connection should close.
asio::awaitable<bool> Connection::execute(std::span<const std::string_view> arguments) {
  using kv::resp::iequals;
  const auto name = arguments[0];
  const auto arity = arguments.size();
  auto& store = server_.store_;
  if (iequals(name, "PING")) {
    if (arity == 1) {
      kv::resp::append_simple(out_, "PONG");
    } else if (arity == 2) {
      kv::resp::append_bulk(out_, arguments[1]);
    } else {
      wrong_arity(name);
    }
  } else if (iequals(name, "SET")) {
    if (arity != 3) {
      arity > 3 ? error("ERR syntax error (SET takes no options here)") : wrong_arity(name);
    } else {
      co_await set_inline(arguments[1], arguments[2]);
    }
  } else if (iequals(name, "GET")) {
    arity == 2 ? get_inline(arguments[1]) : wrong_arity(name);
  } else if (iequals(name, "DEL")) {
    if (arity < 2) {
      wrong_arity(name);
    } else {
      std::int64_t removed = 0;
      for (std::size_t i = 1; i < arity; ++i)
        removed += store.erase(arguments[i]) ? 1 : 0;
      kv::resp::append_integer(out_, removed);
    }
  } else if (iequals(name, "DBSIZE")) {
    arity == 1 ? kv::resp::append_integer(out_, static_cast<std::int64_t>(store.keys())) : wrong_arity(name);
  } else if (iequals(name, "FLUSHALL") || iequals(name, "FLUSHDB")) {
    store.clear();
    kv::resp::append_simple(out_, "OK");
  } else if (iequals(name, "INFO") || iequals(name, "DMA.INFO")) {
    kv::resp::append_bulk(out_, server_.info());
  } else if (iequals(name, "COMMAND")) {
    kv::resp::append_array_header(out_, 0);  // redis-cli asks for command docs; it has no hints from us
  } else if (iequals(name, "QUIT")) {
    kv::resp::append_simple(out_, "OK");
    co_return false;
  } else if (iequals(name, "DMA.HELLO")) {
    arity == 2 ? co_await hello(arguments[1]) : wrong_arity(name);
  } else if (iequals(name, "DMA.SET") || iequals(name, "DMA.GET")) {
    const bool set = iequals(name, "DMA.SET");
    if (client_id_ == 0) {
      error("ERR DMA.HELLO first: this connection has no fabric address");
    } else if (set && (arity == 5 || arity == 6)) {
      co_await dma_set(arguments);
    } else if (!set && arity == 5) {
      co_await dma_get(arguments);
    } else {
      wrong_arity(name);
    }
  } else {
    std::string text = "ERR unknown command '" + std::string(name.substr(0, 64)) + "'";
    error(text);
  }
  co_return true;
}

asio::awaitable<void> Connection::set_inline(std::string_view key, std::string_view value) {
  auto& store = server_.store_;
  if (value.size() > server_.options_.max_value) {
    error("ERR value of " + std::to_string(value.size()) + " bytes exceeds the limit of " +
          std::to_string(server_.options_.max_value));
    co_return;
  }
  if (!store.reserve(value.size())) {
    error("OOM the store's memory limit (" + std::to_string(store.max_bytes()) + " bytes) is reached");
    co_return;
  }
  kv::Value stored;
  stored.length = value.size();
  stored.crc = dma::checksum(std::as_bytes(std::span(value)));
  if (!value.empty()) {
    auto [ec, region] = co_await server_.service_.register_region(kv::Buffer(value.size()), tuple_awaitable);
    if (ec) {
      store.release(value.size());
      error("ERR registering " + std::to_string(value.size()) + " bytes: " + ec.message());
      co_return;
    }
    std::memcpy(region.bytes().data(), value.data(), value.size());
    stored.region = std::move(region);
  }
  store.put(key, std::move(stored));
  kv::resp::append_simple(out_, "OK");
}

void Connection::get_inline(std::string_view key) {
  auto value = server_.store_.get(key);
  if (!value) return kv::resp::append_nil(out_);
  out_ += kv::resp::bulk_header(value->length);
  if (value->length == 0) {
    out_ += "\r\n";
  } else {
    payload_ = std::move(*value);
  }
}

asio::awaitable<void> Connection::hello(std::string_view address_hex) {
  auto& counters = server_.counters_;
  if (client_id_ != 0) {
    error("ERR DMA.HELLO was already sent on this connection");
    co_return;
  }
  auto reject = [&](const std::string& why) {
    ++counters.hellos_rejected;
    error("ERR invalid fabric address: " + why);
  };
  if (address_hex.size() > 2 * dma::PeerAddress::capacity) co_return reject("longer than any supported format");
  std::error_code ec;
  const auto address = dma::decode_hex(address_hex, ec);
  if (ec) co_return reject("not hex");
  if (ec = dma::validate_address(address, server_.info_.addr_format); ec) co_return reject(ec.message());
  if (!server_.options_.allow_any_fabric_host) {
    if (auto why = kv::check_same_host(address, server_.info_.addr_format, peer_); !why.empty()) {
      co_return reject(why);
    }
  }
  const std::uint64_t id = server_.next_client_id_++;
  auto [inserted] = co_await server_.service_.add_peer(id, address, tuple_awaitable);
  if (inserted) co_return reject("inserting it: " + inserted.message());
  client_id_ = id;
  fabric_address_ = address;
  ++counters.hellos;
  ++counters.dma_clients;
  kv::resp::append_array_header(out_, 3);
  kv::resp::append_bulk(out_, dma::encode_hex(server_.service_.local_address()));
  kv::resp::append_integer(out_, static_cast<std::int64_t>(id));
  kv::resp::append_integer(out_, static_cast<std::int64_t>(server_.options_.max_value));
}

// `<rkey> <remote-addr> <length>` of DMA.SET, and DMA.GET's `<rkey> <remote-addr> <capacity>`.
struct Window {
  std::uint64_t rkey = 0;
  std::uint64_t address = 0;
  std::uint64_t length = 0;
};

// Fills window, or returns the error to reply.
std::string parse_window(std::span<const std::string_view> fields, const char* length_name, Window& window) {
  const auto rkey = dma::parse_u64(fields[0]);
  if (!rkey) return "ERR invalid rkey '" + std::string(fields[0].substr(0, 32)) + "'";
  const auto address = dma::parse_u64(fields[1]);
  if (!address) return "ERR invalid remote address '" + std::string(fields[1].substr(0, 32)) + "'";
  const auto length = dma::parse_u64(fields[2]);
  if (!length) return "ERR invalid " + std::string(length_name) + " '" + std::string(fields[2].substr(0, 32)) + "'";
  if (*length > UINT64_MAX - *address) return "ERR the remote range overflows";
  window = Window{*rkey, *address, *length};
  return {};
}

asio::awaitable<void> Connection::dma_set(std::span<const std::string_view> arguments) {
  auto& store = server_.store_;
  auto& counters = server_.counters_;
  const auto key = arguments[1];
  Window window;
  if (auto why = parse_window(arguments.subspan(2, 3), "length", window); !why.empty()) co_return error(why);
  std::optional<std::uint32_t> expected;
  if (arguments.size() == 6) {
    const auto crc = dma::parse_u64(arguments[5]);
    if (!crc || *crc > UINT32_MAX)
      co_return error("ERR invalid crc32c '" + std::string(arguments[5].substr(0, 32)) + "'");
    expected = static_cast<std::uint32_t>(*crc);
  }
  const std::size_t length = window.length;
  if (window.length > server_.options_.max_value) {
    co_return error("ERR value of " + std::to_string(window.length) + " bytes exceeds the limit of " +
                    std::to_string(server_.options_.max_value));
  }
  if (length == 0) {
    if (expected && *expected != 0) co_return error("ERR CRC mismatch: an empty value has crc32c 0");
    store.put(key, kv::Value{});
    co_return kv::resp::append_simple(out_, "OK");
  }
  if (!store.reserve(length)) {
    co_return error("OOM the store's memory limit (" + std::to_string(store.max_bytes()) + " bytes) is reached");
  }
  auto [registered, region] = co_await server_.service_.register_region(kv::Buffer(length), tuple_awaitable);
  if (registered) {
    store.release(length);
    co_return error("ERR registering " + std::to_string(length) + " bytes: " + registered.message());
  }
  dma::TransferRequest<Slot> request;
  request.client_id = client_id_;
  request.peer_address = fabric_address_;
  request.remote_key = window.rkey;
  request.remote_address = window.address;
  request.direction = dma::Direction::FromPeer;
  request.length = length;
  request.want_checksum = true;
  request.caller_context = Slot{std::move(region), length};
  std::optional<InFlight> in_flight(std::in_place, counters.sets_in_flight);
  auto [slot, outcome] = co_await server_.service_.submit(std::move(request));
  in_flight.reset();
  if (!account(outcome)) {
    store.release(length);
    co_return error("ERR transfer failed: " + outcome.message());
  }
  counters.bytes_read += length;
  const std::uint32_t crc = outcome->checksum.value_or(0);
  if (expected && *expected != crc) {
    ++counters.crc_mismatches;
    store.release(length);
    co_return error("ERR CRC mismatch: the client sent crc32c " + std::to_string(*expected) + ", the server read " +
                    std::to_string(crc) + "; the store is unchanged");
  }
  store.put(key, kv::Value{std::move(slot.region), length, crc});
  kv::resp::append_simple(out_, "OK");
}

asio::awaitable<void> Connection::dma_get(std::span<const std::string_view> arguments) {
  auto& counters = server_.counters_;
  Window window;
  if (auto why = parse_window(arguments.subspan(2, 3), "capacity", window); !why.empty()) co_return error(why);
  auto value = server_.store_.get(arguments[1]);
  if (!value) co_return error("ERR no such key");
  if (value->length > window.length) {
    co_return error("ERR the value is " + std::to_string(value->length) + " bytes, the client's buffer holds " +
                    std::to_string(window.length));
  }
  if (value->length > 0) {
    dma::TransferRequest<Slot> request;
    request.client_id = client_id_;
    request.peer_address = fabric_address_;
    request.remote_key = window.rkey;
    request.remote_address = window.address;
    request.direction = dma::Direction::ToPeer;
    request.caller_context = Slot{value->region, value->length};
    std::optional<InFlight> in_flight(std::in_place, counters.gets_in_flight);
    auto [slot, outcome] = co_await server_.service_.submit(std::move(request));
    in_flight.reset();
    if (!account(outcome)) co_return error("ERR transfer failed: " + outcome.message());
    counters.bytes_written += value->length;
  }
  kv::resp::append_array_header(out_, 2);
  kv::resp::append_integer(out_, static_cast<std::int64_t>(value->length));
  kv::resp::append_integer(out_, value->crc);
}

asio::awaitable<void> Server::accept() {
  for (;;) {
    auto [ec, socket] = co_await acceptor_.async_accept(asio::make_strand(io_), tuple_awaitable);
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
    if (ec) continue;  // e.g. EMFILE: the listening socket stays usable
    ++counters_.connections_total;
    std::shared_ptr<Connection> connection;
    {
      std::lock_guard lock(connections_mutex_);
      if (connections_.size() >= options_.max_clients) {
        ++counters_.connections_rejected;
        std::error_code ignored;
        asio::write(socket, asio::buffer(std::string_view("-ERR max number of clients reached\r\n")), ignored);
        continue;
      }
      connection = std::make_shared<Connection>(*this, std::move(socket));
      connections_.insert(connection);
    }
    asio::co_spawn(connection->executor(), connection->run(), asio::detached);
  }
}

// Closes every connection; each ends once its current command's transfer has completed. A
// transfer that never completes would hold the process, so after a bound it exits regardless.
asio::awaitable<void> Server::stop() {
  std::error_code ignored;
  acceptor_.close(ignored);
  {
    std::lock_guard lock(connections_mutex_);
    for (const auto& connection : connections_)
      connection->close();
  }
  asio::steady_timer timer(io_);
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard lock(connections_mutex_);
      if (connections_.empty()) co_return;
    }
    timer.expires_after(10ms);
    co_await timer.async_wait(asio::use_awaitable);
  }
  std::fprintf(stderr, "dma-kv-server: connections still busy 5 s after the stop signal; exiting\n");
  std::_Exit(1);
}

std::string Server::info() const {
  const auto m = service_.metrics();
  const auto uptime = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_);
  std::size_t connected = 0;
  {
    std::lock_guard lock(connections_mutex_);
    connected = connections_.size();
  }
  std::string s;
  auto line = [&](std::string_view field, auto value) {
    s += field;
    s += ':';
    if constexpr (std::is_convertible_v<decltype(value), std::string_view>) {
      s += std::string_view(value);
    } else {
      s += std::to_string(value);
    }
    s += "\r\n";
  };
  s += "# Server\r\n";
  line("server", "dma-kv-server");
  line("libfabric_version", dma::fabric_version());
  line("provider", info_.provider);
  line("fabric_address", dma::encode_hex(service_.local_address()));
  line("tcp_port", acceptor_.is_open() ? acceptor_.local_endpoint().port() : 0);
  line("threads", options_.threads);
  line("uptime_in_seconds", uptime.count());
  line("any_fabric_host", options_.allow_any_fabric_host ? "yes" : "no");
  s += "\r\n# Clients\r\n";
  line("connected_clients", connected);
  line("dma_clients", counters_.dma_clients.load());
  line("total_connections_received", counters_.connections_total.load());
  line("rejected_connections", counters_.connections_rejected.load());
  line("max_clients", options_.max_clients);
  s += "\r\n# Keyspace\r\n";
  line("keys", store_.keys());
  line("bytes_stored", store_.bytes());
  line("max_memory", store_.max_bytes());
  line("max_value", options_.max_value);
  s += "\r\n# Commands\r\n";
  line("commands_processed", counters_.commands.load());
  line("error_replies", counters_.error_replies.load());
  line("protocol_errors", counters_.protocol_errors.load());
  line("hellos", counters_.hellos.load());
  line("hellos_rejected", counters_.hellos_rejected.load());
  s += "\r\n# Transfers\r\n";
  line("outstanding", service_.outstanding());
  line("dma_sets_in_flight", counters_.sets_in_flight.load());
  line("dma_gets_in_flight", counters_.gets_in_flight.load());
  line("transfers_ok", counters_.transfers_ok.load());
  line("transfers_failed", counters_.transfers_failed.load());
  line("transfers_timed_out", counters_.transfers_timed_out.load());
  line("crc_mismatches", counters_.crc_mismatches.load());
  line("bytes_read_from_clients", counters_.bytes_read.load());
  line("bytes_written_to_clients", counters_.bytes_written.load());
  s += "\r\n# Service\r\n";
  line("posted", m.posted);
  line("completed", m.completed);
  line("failed", m.failed);
  line("eagain", m.eagain);
  line("cq_reads", m.cq_reads);
  line("fd_wakeups", m.fd_wakeups);
  line("backstop_hits", m.backstop_hits);
  line("context_less_errors", m.context_less_errors);
  line("registrations", m.registrations);
  line("cache_entries", m.cache_entries);
  line("cache_bytes", m.cache_bytes);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"dma-kv-server: a RESP key-value server whose values move through a one-sided side channel"};
  app.add_option("--port", options.port, "TCP port for RESP; 0 picks a free one")->capture_default_str();
  app.add_option("--bind", options.bind, "address for RESP and the fabric endpoint")->capture_default_str();
  app.add_option("--threads", options.threads, "threads running the server")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_flag("--efa", options.efa, "use efa-direct instead of tcp");
  app.add_option("--max-value", options.max_value, "largest value, bytes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-memory", options.max_memory, "bytes of values the store holds at most")->capture_default_str();
  app.add_option("--max-clients", options.max_clients, "connections served at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag(
      "--allow-any-fabric-host", options.allow_any_fabric_host,
      "accept a DMA.HELLO whose fabric address names another host than its connection (trusted networks only)");
  app.add_option("--config", options.config, "TOML file whose [dma-libfabric] table configures the service");
  app.add_option("--transfer-deadline", options.transfer_deadline_ms,
                 "milliseconds a transfer may take before it fails (0: the configuration's, 30 s by default)");
  CLI11_PARSE(app, argc, argv);

  dma::Configuration configuration;
  if (!options.config.empty()) {
    try {
      configuration = dma::Configuration::from_toml(options.config);
    } catch (const dma::ConfigurationError& error) {
      std::fprintf(stderr, "dma-kv-server: --config: %s\n", error.what());
      return 2;  // like every other program: a refused configuration file is a usage error
    }
  }
  try {
    if (options.transfer_deadline_ms != 0) {
      configuration.transfer_deadline = std::chrono::milliseconds(options.transfer_deadline_ms);
    }
    if (options.efa) {
      configuration.providers = {dma::Provider::efa_direct};
    } else {
      configuration.providers = {dma::Provider::tcp};
      configuration.bind = options.bind;
    }
    asio::io_context io(static_cast<int>(options.threads));
    Server server(io, options, configuration);
    std::printf("listening on %s:%u\n", options.bind.c_str(), server.port());
    std::printf("fabric %s, address %s\n", server.info_.provider.c_str(),
                dma::encode_hex(server.service_.local_address()).c_str());
    std::fflush(stdout);

    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code ec, int) {
      if (!ec) asio::co_spawn(io, server.stop(), asio::detached);
    });
    asio::co_spawn(io, server.accept(), asio::detached);
    std::vector<std::thread> threads;
    for (unsigned i = 1; i < options.threads; ++i)
      threads.emplace_back([&] { io.run(); });
    io.run();
    for (auto& t : threads)
      t.join();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
