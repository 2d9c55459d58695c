// dma-kv-server: a RESP2 key-value server whose large values travel through a one-sided side
// channel. A client says DMA.HELLO with its fabric address, then DMA.SET makes the server read a
// value out of the client's registered buffer and DMA.GET makes it write one in; PING, SET, GET
// and DEL work inline, so redis-cli shares the same store. See docs/side-channel.md.
//   dma-kv-server [--port P] [--threads N] [--max-value BYTES] [--max-memory BYTES] ...
#include <dma/dma.hpp>
#include <dma/kv/hello_bindings.hpp>
#include <dma/kv/protocol.hpp>
#include <dma/kv/resp.hpp>

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

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using asio::ip::tcp;
namespace errors = dma::kv::errors;
using namespace std::chrono_literals;
constexpr auto tuple_awaitable = dma::compat::as_tuple(asio::use_awaitable);

// The protocol's settings (dma::kv::ServerSettings: max-value, confirm-gets, ...), and the server's own.
struct Options : dma::kv::ServerSettings {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 6380;
  unsigned threads = 1;
  bool efa = false;
  std::size_t max_memory = std::size_t{1} << 30;
  std::size_t max_clients = 1024;
  std::size_t max_client_buffers = std::size_t{1} << 30;  ///< every connection's input and output buffers
  std::size_t client_output_limit = std::size_t{1} << 20;
  unsigned client_output_seconds = 60;
  unsigned idle_timeout = 0;  ///< seconds; 0: never
  std::string config;         // a TOML file's [dma-libfabric] table, applied first
};

// One transfer's context: a stored (or arriving) value, which it keeps alive.
struct Slot {
  kv::Value value;
  std::span<const std::byte> source() const { return value.bytes(); }
  std::span<std::byte> allocate(std::size_t n) const { return value.writable().first(std::min(n, value.length)); }
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
  std::atomic<std::uint64_t> no_hello{0};  ///< data commands whose client the server could not place
  std::atomic<std::uint64_t> transfers_ok{0};
  std::atomic<std::uint64_t> transfers_failed{0};
  std::atomic<std::uint64_t> transfers_timed_out{0};
  std::atomic<std::uint64_t> crc_mismatches{0};
  std::atomic<std::uint64_t> bytes_read{0};      ///< pulled out of clients by DMA.SET
  std::atomic<std::uint64_t> bytes_written{0};   ///< pushed into clients by DMA.GET
  std::atomic<std::uint64_t> gets_notified{0};   ///< DMA.GET writes that carried the client's token
  std::atomic<std::uint64_t> dma_clients{0};     ///< connections past DMA.HELLO now
  std::atomic<std::uint64_t> sets_in_flight{0};  ///< DMA.SET transfers submitted and not completed
  std::atomic<std::uint64_t> gets_in_flight{0};
  std::atomic<std::uint64_t> closed_idle{0};          ///< by --idle-timeout
  std::atomic<std::uint64_t> closed_output{0};        ///< replies stalled past the output limit
  std::atomic<std::uint64_t> closed_input_budget{0};  ///< input buffer could not grow
  std::atomic<std::uint64_t> oom_replies{0};
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
        values_(std::make_shared<kv::Budget>(options.max_memory)),
        client_buffers_(options.max_client_buffers),
        service_(io, configuration),
        info_(service_.describe()),
        confirmation_(dma::kv::resolve_confirmation(options.confirm_gets, info_)),
        acceptor_(io, tcp::endpoint(asio::ip::make_address(options.bind), options.port)),
        bindings_(dma::kv::HelloBindings::Limits{options.max_hello_bindings,
                                                 std::chrono::seconds(options.hello_idle_seconds)}),
        started_(std::chrono::steady_clock::now()) {
    if (auto why = dma::kv::check_token_room(info_);
        !why.empty() && confirmation_ == dma::kv::Confirmation::notification) {
      throw std::runtime_error("--confirm-gets notification: " + why);
    }
    // A bulk somewhat over the value limit still parses, so SET can answer it with an error.
    limits_.max_bulk = options.max_value + 64 * 1024;
    limits_.max_request = limits_.max_bulk + 64 * 1024;
  }

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  asio::awaitable<void> accept();
  asio::awaitable<void> refuse(tcp::socket socket);
  asio::awaitable<void> sweep();
  asio::awaitable<void> stop();
  std::string info() const;

  asio::io_context& io_;
  const Options options_;
  // Declared before the service: value storage can outlive a registration, never the budget.
  const std::shared_ptr<kv::Budget> values_;  ///< every value's storage alive (--max-memory)
  kv::Budget client_buffers_;                 ///< input and output buffers (--max-client-buffers)
  std::atomic<std::size_t> input_bytes_{0};
  std::atomic<std::size_t> output_bytes_{0};
  Service service_;
  const dma::EndpointInfo info_;
  const dma::kv::Confirmation confirmation_;  ///< what the DMA.HELLO reply tells clients
  tcp::acceptor acceptor_;
  kv::Store store_;
  dma::kv::resp::Limits limits_;
  Counters counters_;
  std::atomic<std::uint64_t> next_client_id_{1};
  dma::kv::HelloBindings bindings_;    ///< every client's DMA.HELLO, by token
  std::atomic<unsigned> refusing_{0};  ///< refused connections still draining their input
  const std::chrono::steady_clock::time_point started_;

  mutable std::mutex connections_mutex_;
  std::set<std::shared_ptr<Connection>> connections_;
};

// Nanoseconds on the steady clock, for times one thread writes and the sweeper reads.
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A connection's input buffer: it grows as bytes arrive (doubling when full, never from a length a
// request declares), its capacity charged to the server's client-buffer budget.
class InputBuffer {
 public:
  static constexpr std::size_t initial = 16 * 1024;

  InputBuffer(kv::Budget& budget, std::atomic<std::size_t>& gauge) : budget_(budget), gauge_(gauge) {
    resize(initial, true);
  }
  ~InputBuffer() { resize(0, true); }
  InputBuffer(const InputBuffer&) = delete;
  InputBuffer& operator=(const InputBuffer&) = delete;

  std::string_view pending() const { return {data_.get() + begin_, end_ - begin_}; }
  void consume(std::size_t n) { begin_ += n; }
  asio::mutable_buffer free_space() { return asio::buffer(data_.get() + end_, size_ - end_); }
  void commit(std::size_t n) { end_ += n; }

  /// Makes room for more input, up to `limit` bytes of buffer. False when the buffer is full at
  /// the limit, or the budget has no room for it to grow.
  bool make_room(std::size_t limit) {
    const std::size_t pending = end_ - begin_;
    if (begin_ > 0 && (end_ == size_ || begin_ > size_ / 2)) {
      std::memmove(data_.get(), data_.get() + begin_, pending);
      begin_ = 0;
      end_ = pending;
    }
    if (pending == 0 && size_ > (std::size_t{1} << 20)) resize(initial, true);
    if (end_ < size_) return true;
    if (size_ >= limit) return false;
    return resize(std::min(limit, size_ * 2), false);
  }

 private:
  bool resize(std::size_t size, bool force) {
    if (size > size_) {
      if (force) {
        budget_.charge(size - size_);
      } else if (!budget_.try_charge(size - size_)) {
        return false;
      }
      gauge_ += size - size_;
    } else {
      budget_.release(size_ - size);
      gauge_ -= size_ - size;
    }
    if (size == 0) {
      data_.reset();
    } else {
      auto grown = std::make_unique_for_overwrite<char[]>(size);
      if (end_ > begin_) std::memcpy(grown.get(), data_.get() + begin_, end_ - begin_);
      data_ = std::move(grown);
    }
    end_ -= begin_;
    begin_ = 0;
    size_ = size;
    return true;
  }

  kv::Budget& budget_;
  std::atomic<std::size_t>& gauge_;
  std::unique_ptr<char[]> data_;
  std::size_t size_ = 0;
  std::size_t begin_ = 0;  ///< first unparsed byte
  std::size_t end_ = 0;    ///< one past the last received byte
};

// One RESP connection, served by one coroutine on its own strand. Commands run one at a time, in
// order, each with its transfer awaited before the next; the replies of every complete command in
// the input are written together, in batches of at most `output_batch` bytes (plus one reply).
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), input_(server.client_buffers_, server.input_bytes_) {
    std::error_code ec;
    peer_ = socket_.remote_endpoint(ec).address();
    socket_.set_option(tcp::no_delay(true), ec);
    socket_.non_blocking(true, ec);
  }
  ~Connection() { release_output(); }

  asio::awaitable<void> run();
  tcp::socket::executor_type executor() { return socket_.get_executor(); }
  /// Closes the socket from any thread; the coroutine then ends after its current command.
  void close() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      std::error_code ec;
      self->socket_.close(ec);
    });
  }
  /// True the first time only: the sweeper closes and counts a connection once.
  bool sweep_once() { return !swept_.exchange(true); }
  /// Nanoseconds since it started waiting for a request, or since its reply last made progress
  /// (0: busy with a command).
  std::int64_t idle_since() const { return idle_since_.load(std::memory_order_relaxed); }
  /// Nanoseconds since it started writing a reply batch of --client-output-limit bytes or more
  /// (0: none).
  std::int64_t output_over_since() const { return output_over_since_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::size_t output_batch = 64 * 1024;

  // A value written after out_'s first `text_end` bytes (and before the rest).
  struct Payload {
    std::size_t text_end;
    kv::Value value;
  };

  std::optional<bool> execute_now(std::span<const std::string_view> arguments);
  asio::awaitable<bool> execute(std::span<const std::string_view> arguments);
  asio::awaitable<void> hello(std::span<const std::string_view> arguments);
  std::optional<dma::kv::Binding> client_of(std::optional<std::string_view> named);
  asio::awaitable<void> dma_set(const dma::kv::TransferRequest& request, dma::kv::Binding client);
  asio::awaitable<void> dma_get(const dma::kv::TransferRequest& request, dma::kv::Binding client);
  void set_inline(std::string_view key, std::string_view value);
  asio::awaitable<void> set_registered(std::string_view key, std::string_view value);
  std::optional<kv::Value> new_value(std::size_t length, kv::Buffer::Fill fill);
  asio::awaitable<std::optional<kv::Value>> new_registered_value(std::size_t length, kv::Buffer::Fill fill);
  void get_inline(std::string_view key);
  void error(std::string_view text) {
    ++server_.counters_.error_replies;
    dma::kv::resp::append_error(out_, text);
  }
  void out_of_memory() {
    ++server_.counters_.oom_replies;
    error(errors::value_memory_full(server_.values_->limit(), "--max-memory"));
  }
  void wrong_arity(std::string_view command) { error(errors::wrong_arity(command)); }
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
  std::size_t pending_output() const {
    std::size_t n = out_.size();
    for (const auto& p : payloads_)
      n += p.value.length;
    return n;
  }
  void release_output() {
    server_.client_buffers_.release(output_charged_);
    server_.output_bytes_ -= output_charged_;
    output_charged_ = 0;
  }
  asio::awaitable<bool> flush();

  Server& server_;
  tcp::socket socket_;
  asio::ip::address peer_;
  InputBuffer input_;
  std::string out_;                ///< the replies being built
  std::vector<Payload> payloads_;  ///< inline GETs' values, written from their storage
  std::size_t output_charged_ = 0;
  std::atomic<std::int64_t> idle_since_{0};
  std::atomic<std::int64_t> output_over_since_{0};
  std::atomic<bool> swept_{false};
  std::optional<dma::kv::Binding> hello_;  ///< the binding this connection's DMA.HELLO made
};

// The buffers after their first n bytes.
std::vector<asio::const_buffer> skip(const std::vector<asio::const_buffer>& buffers, std::size_t n) {
  std::vector<asio::const_buffer> rest;
  rest.reserve(buffers.size());
  for (const auto& b : buffers) {
    if (n >= b.size()) {
      n -= b.size();
    } else {
      rest.push_back(b + n);
      n = 0;
    }
  }
  return rest;
}

// Writes the pending replies with one gathering write.
asio::awaitable<bool> Connection::flush() {
  if (out_.empty()) co_return true;
  std::vector<asio::const_buffer> buffers;
  buffers.reserve(2 * payloads_.size() + 1);
  std::size_t text = 0;
  for (const auto& p : payloads_) {
    buffers.emplace_back(out_.data() + text, p.text_end - text);
    buffers.emplace_back(p.value.bytes().data(), p.value.length);
    text = p.text_end;
  }
  buffers.emplace_back(out_.data() + text, out_.size() - text);
  const std::size_t total = pending_output();
  output_charged_ = out_.capacity();
  server_.client_buffers_.charge(output_charged_);
  server_.output_bytes_ += output_charged_;
  // The batch holds its text and values until the client has taken all of it: a large one left
  // unfinished too long closes the connection (sweep), and so does a write that makes no progress
  // for the idle timeout.
  if (total >= server_.options_.client_output_limit) output_over_since_.store(now_ns(), std::memory_order_relaxed);
  idle_since_.store(now_ns(), std::memory_order_relaxed);
  // Most batches fit the socket's send buffer: written from here, with no completion through the
  // scheduler. What does not fit goes out asynchronously.
  std::error_code ec;
  std::size_t written = 0;
  while (written < total && !ec)
    written += socket_.write_some(skip(buffers, written), ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) {
    auto [failed, rest] = co_await asio::async_write(
        socket_, skip(buffers, written),
        [this, last = std::size_t{0}](const std::error_code& e, std::size_t now) mutable -> std::size_t {
          if (now > last) idle_since_.store(now_ns(), std::memory_order_relaxed);
          last = now;
          return asio::transfer_all()(e, now);
        },
        tuple_awaitable);
    ec = failed;
  }
  idle_since_.store(0, std::memory_order_relaxed);
  output_over_since_.store(0, std::memory_order_relaxed);
  release_output();
  payloads_.clear();
  out_.clear();
  if (out_.capacity() > output_batch) out_.shrink_to_fit();
  co_return !ec;
}

bool is_transfer(std::string_view name) {
  return dma::kv::resp::iequals(name, "DMA.SET") || dma::kv::resp::iequals(name, "DMA.GET");
}

asio::awaitable<void> Connection::run() {
  const auto self = shared_from_this();
  std::vector<std::string_view> arguments;
  const std::size_t input_limit = server_.limits_.max_request + 128 * 1024;
  for (;;) {
    const auto parsed = dma::kv::resp::parse_request(input_.pending(), server_.limits_, arguments);
    if (parsed.status == dma::kv::resp::Status::complete) {
      input_.consume(parsed.consumed);
      if (arguments.empty()) continue;
      ++server_.counters_.commands;
      // Replies already built go out before a transfer that may take long.
      if (is_transfer(arguments[0]) && !co_await flush()) break;
      const auto now = execute_now(arguments);
      const bool open = now ? *now : co_await execute(arguments);
      if (!open || pending_output() >= output_batch) {
        if (!co_await flush() || !open) break;
      }
      continue;
    }
    if (!co_await flush()) break;
    if (parsed.status == dma::kv::resp::Status::error) {
      ++server_.counters_.protocol_errors;
      error(errors::protocol(parsed.error));
      co_await flush();
      break;
    }
    if (!input_.make_room(input_limit)) {
      ++server_.counters_.protocol_errors;
      if (input_.free_space().size() == 0 && input_.pending().size() < input_limit) {
        ++server_.counters_.closed_input_budget;
        error(errors::client_buffers_full(server_.client_buffers_.limit(), "--max-client-buffers"));
      } else {
        error(errors::request_too_large());
      }
      co_await flush();
      break;
    }
    idle_since_.store(now_ns(), std::memory_order_relaxed);
    auto [ec, n] = co_await socket_.async_read_some(input_.free_space(), tuple_awaitable);
    idle_since_.store(0, std::memory_order_relaxed);
    if (ec) break;
    input_.commit(n);
  }
  std::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  payloads_.clear();
  if (hello_) {
    // Shared with the client's other connections, it stays until left idle.
    if (server_.bindings_.release(hello_->id)) server_.service_.remove_peer(hello_->id);
    --server_.counters_.dma_clients;
  }
  std::lock_guard lock(server_.connections_mutex_);
  server_.connections_.erase(self);
}

// Runs a command that completes at once, appending its reply to out_ (and payloads_): true or
// false as execute(), nullopt for a command that must be awaited (a transfer, a HELLO, a
// registration), which execute() runs. Most commands take this path: no coroutine frame.
std::optional<bool> Connection::execute_now(std::span<const std::string_view> arguments) {
  using dma::kv::resp::iequals;
  const auto name = arguments[0];
  const auto arity = arguments.size();
  auto& store = server_.store_;
  if (iequals(name, "PING")) {
    if (arity == 1) {
      dma::kv::resp::append_simple(out_, "PONG");
    } else if (arity == 2) {
      dma::kv::resp::append_bulk(out_, arguments[1]);
    } else {
      wrong_arity(name);
    }
  } else if (iequals(name, "SET")) {
    if (arity != 3) {
      arity > 3 ? error(errors::set_options()) : wrong_arity(name);
    } else if (server_.info_.requires_local_mr && !arguments[2].empty()) {
      return std::nullopt;  // registering the value is a trip through the service
    } else {
      set_inline(arguments[1], arguments[2]);
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
      dma::kv::resp::append_integer(out_, removed);
    }
  } else if (iequals(name, "DBSIZE")) {
    arity == 1 ? dma::kv::resp::append_integer(out_, static_cast<std::int64_t>(store.keys())) : wrong_arity(name);
  } else if (iequals(name, "FLUSHALL") || iequals(name, "FLUSHDB")) {
    store.clear();
    dma::kv::resp::append_simple(out_, "OK");
  } else if (iequals(name, "INFO")) {  // redis-cli's INFO [section]: every section
    dma::kv::resp::append_bulk(out_, server_.info());
  } else if (iequals(name, "DMA.INFO")) {
    dma::kv::arity_fits(dma::kv::info_command, arity) ? dma::kv::resp::append_bulk(out_, server_.info())
                                                      : wrong_arity(name);
  } else if (iequals(name, "COMMAND")) {
    dma::kv::resp::append_array_header(out_, 0);  // redis-cli asks for command docs; it has no hints from us
  } else if (iequals(name, "QUIT")) {
    dma::kv::resp::append_simple(out_, "OK");
    return false;
  } else if (iequals(name, "DMA.HELLO") || iequals(name, "DMA.SET") || iequals(name, "DMA.GET")) {
    return std::nullopt;
  } else {
    error(errors::unknown_command(name));
  }
  return true;
}

// Runs a command execute_now() left to it (one that waits on the service), appending its reply
// to out_; false when the connection should close.
asio::awaitable<bool> Connection::execute(std::span<const std::string_view> arguments) {
  using dma::kv::resp::iequals;
  const auto name = arguments[0];
  if (iequals(name, "SET")) {
    co_await set_registered(arguments[1], arguments[2]);
  } else if (iequals(name, "DMA.HELLO")) {
    co_await hello(arguments);
  } else if (iequals(name, "DMA.SET") || iequals(name, "DMA.GET")) {
    const bool set = iequals(name, "DMA.SET");
    const auto request =
        set ? dma::kv::parse_set(arguments, server_.options_.max_value) : dma::kv::parse_get(arguments);
    if (!request.error.empty()) {
      error(request.error);
    } else if (auto client = client_of(request.client); !client) {
      ++server_.counters_.no_hello;
      error(errors::no_hello(request.client));
    } else if (set) {
      co_await dma_set(request, *client);
    } else {
      co_await dma_get(request, *client);
    }
  } else {
    error(errors::unknown_command(name));
  }
  co_return true;
}

// A new value of `length` bytes where the provider needs no registration of local buffers (tcp,
// shm): one allocation, and a transfer's operand in it binds no registration. Nullopt after
// replying OOM.
std::optional<kv::Value> Connection::new_value(std::size_t length, kv::Buffer::Fill fill) {
  auto bytes = kv::Bytes::allocate(server_.values_, length, fill);
  if (!bytes) {
    out_of_memory();
    return std::nullopt;
  }
  return kv::Value{{}, std::move(*bytes), length, 0};
}

// A new value of `length` bytes in storage registered with the service (efa); nullopt after
// replying the error.
asio::awaitable<std::optional<kv::Value>> Connection::new_registered_value(std::size_t length, kv::Buffer::Fill fill) {
  auto buffer = kv::Buffer::allocate(server_.values_, length, fill);
  if (!buffer) {
    out_of_memory();
    co_return std::nullopt;
  }
  auto [ec, registered] = co_await server_.service_.register_region(std::move(*buffer), tuple_awaitable);
  if (ec) {
    error(errors::registration_failed(length, ec.message()));
    co_return std::nullopt;
  }
  co_return kv::Value{std::move(registered), {}, length, 0};
}

void Connection::set_inline(std::string_view key, std::string_view value) {
  if (value.size() > server_.options_.max_value) {
    return error(errors::value_too_large(value.size(), server_.options_.max_value));
  }
  kv::Value stored;
  if (!value.empty()) {
    auto allocated = new_value(value.size(), kv::Buffer::Fill::overwritten);
    if (!allocated) return;
    stored = std::move(*allocated);
    std::memcpy(stored.writable().data(), value.data(), value.size());
  }
  stored.crc = dma::checksum(std::as_bytes(std::span(value)));
  server_.store_.put(key, std::move(stored));
  dma::kv::resp::append_simple(out_, "OK");
}

asio::awaitable<void> Connection::set_registered(std::string_view key, std::string_view value) {
  if (value.size() > server_.options_.max_value) {
    co_return error(errors::value_too_large(value.size(), server_.options_.max_value));
  }
  auto stored = co_await new_registered_value(value.size(), kv::Buffer::Fill::overwritten);
  if (!stored) co_return;
  std::memcpy(stored->writable().data(), value.data(), value.size());
  stored->crc = dma::checksum(std::as_bytes(std::span(value)));
  server_.store_.put(key, std::move(*stored));
  dma::kv::resp::append_simple(out_, "OK");
}

void Connection::get_inline(std::string_view key) {
  auto value = server_.store_.get(key);
  if (!value) return dma::kv::resp::append_nil(out_);
  out_ += dma::kv::resp::bulk_header(value->length);
  if (value->length > 0) payloads_.push_back(Payload{out_.size(), std::move(*value)});
  out_ += "\r\n";
}
// The client a data command is for: the binding its `CLIENT <token>` names, or this connection's.
std::optional<dma::kv::Binding> Connection::client_of(std::optional<std::string_view> named) {
  if (named) return server_.bindings_.find(*named, hello_ ? hello_->id : 0);
  if (hello_) server_.bindings_.touch(hello_->id);
  return hello_;
}

asio::awaitable<void> Connection::hello(std::span<const std::string_view> arguments) {
  auto& counters = server_.counters_;
  auto request = dma::kv::parse_hello(arguments, server_.info_.addr_format);
  if (!request.error.empty()) {
    if (arguments.size() == 2) ++counters.hellos_rejected;
    co_return error(request.error);
  }
  if (hello_) co_return error(errors::hello_repeated());
  auto reject = [&](const std::string& why) {
    ++counters.hellos_rejected;
    error(errors::invalid_fabric_address(why));
  };
  if (!server_.options_.allow_any_fabric_host) {
    if (auto why = dma::kv::check_same_host(request.address, server_.info_.addr_format, peer_.to_string());
        !why.empty()) {
      co_return reject(why);
    }
  }
  const std::uint64_t id = server_.next_client_id_++;
  for (const std::uint64_t gone : server_.bindings_.sweep())
    server_.service_.remove_peer(gone);
  std::vector<std::uint64_t> dropped;
  std::optional<dma::kv::Binding> binding;
  try {
    binding = server_.bindings_.bind(id, request.address, dropped);
  } catch (const std::system_error& e) {
    co_return error(errors::no_random(e.what()));
  }
  for (const std::uint64_t gone : dropped)
    server_.service_.remove_peer(gone);
  if (!binding) {
    ++counters.hellos_rejected;
    co_return error(errors::too_many_bindings("--max-hello-bindings", server_.options_.max_hello_bindings));
  }
  auto [inserted] = co_await server_.service_.add_peer(id, request.address, tuple_awaitable);
  if (inserted) {
    server_.bindings_.release(id);  // never named: it goes
    co_return reject("inserting it: " + inserted.message());
  }
  hello_ = binding;
  ++counters.hellos;
  ++counters.dma_clients;
  dma::kv::append_hello_reply(out_, {dma::encode_hex(server_.service_.local_address()), id, server_.options_.max_value,
                                     server_.confirmation_, binding->token});
}

// A transfer between `slot`'s value and the client's window.
dma::TransferRequest<Slot> transfer_for(const dma::kv::Binding& client, const dma::kv::Window& window,
                                        dma::Direction direction, Slot slot) {
  dma::TransferRequest<Slot> transfer;
  transfer.client_id = client.id;
  transfer.peer_address = client.address;
  transfer.remote_key = window.rkey;
  transfer.remote_address = window.address;
  transfer.direction = direction;
  transfer.caller_context = std::move(slot);
  return transfer;
}

asio::awaitable<void> Connection::dma_set(const dma::kv::TransferRequest& request, dma::kv::Binding client) {
  auto& store = server_.store_;
  auto& counters = server_.counters_;
  const std::size_t length = request.window.length;
  if (length == 0) {
    store.put(request.key, kv::Value{});
    co_return dma::kv::resp::append_simple(out_, "OK");
  }
  // Zeroed storage: a transfer that moves fewer bytes than asked while reporting success (libfabric
  // 1.17's tcp does, for a short read response) leaves zeros, never a former value's bytes.
  std::optional<kv::Value> value;
  if (server_.info_.requires_local_mr) {
    value = co_await new_registered_value(length, kv::Buffer::Fill::zeroed);
  } else {
    value = new_value(length, kv::Buffer::Fill::zeroed);
  }
  if (!value) co_return;
  auto transfer = transfer_for(client, request.window, dma::Direction::FromPeer, Slot{std::move(*value)});
  transfer.length = length;
  transfer.want_checksum = true;
  std::optional<InFlight> in_flight(std::in_place, counters.sets_in_flight);
  // The key outlives the transfer: it views this command's arguments in the input buffer, which
  // holds them until the command's reply is built.
  auto [ec, done] = co_await server_.service_.submit(std::move(transfer), dma::compat::as_tuple(asio::use_awaitable));
  auto& [slot, outcome] = done;
  in_flight.reset();
  if (!account(outcome)) co_return error(errors::transfer_failed(outcome.message()));
  counters.bytes_read += length;
  const std::uint32_t crc = outcome->checksum.value_or(0);
  if (request.crc && *request.crc != crc) {
    ++counters.crc_mismatches;
    co_return error(errors::crc_mismatch(*request.crc));
  }
  slot.value.crc = crc;
  store.put(request.key, std::move(slot.value));
  dma::kv::resp::append_simple(out_, "OK");
}

asio::awaitable<void> Connection::dma_get(const dma::kv::TransferRequest& request, dma::kv::Binding client) {
  auto& counters = server_.counters_;
  auto value = server_.store_.get(request.key);
  if (!value) co_return error(errors::no_such_key());
  if (value->length > request.window.length) {
    co_return error(errors::buffer_too_small(value->length, request.window.length));
  }
  if (value->length > 0) {
    auto transfer = transfer_for(client, request.window, dma::Direction::ToPeer, Slot{*value});
    transfer.immediate_data = request.token;  // the client's Target hears it once the bytes have landed
    std::optional<InFlight> in_flight(std::in_place, counters.gets_in_flight);
    auto [ec, done] = co_await server_.service_.submit(std::move(transfer), dma::compat::as_tuple(asio::use_awaitable));
    in_flight.reset();
    const auto& outcome = done.outcome;
    if (!account(outcome)) co_return error(errors::transfer_failed(outcome.message()));
    counters.bytes_written += value->length;
    if (request.token) ++counters.gets_notified;
  }
  dma::kv::append_get_reply(out_, value->length, value->crc);
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
        auto executor = socket.get_executor();
        asio::co_spawn(executor, refuse(std::move(socket)), asio::detached);
        continue;
      }
      connection = std::make_shared<Connection>(*this, std::move(socket));
      connections_.insert(connection);
    }
    asio::co_spawn(connection->executor(), connection->run(), asio::detached);
  }
}

// Answers a connection over --max-clients with an error line, then reads what it sent (bounded in
// bytes and time) before closing: closing a socket with unread input sends a reset, which can
// discard the error line before the client reads it.
asio::awaitable<void> Server::refuse(tcp::socket socket) {
  constexpr unsigned max_draining = 64;
  std::string refusal;
  dma::kv::resp::append_error(refusal, errors::max_clients());
  std::error_code ignored;
  if (refusing_.fetch_add(1) >= max_draining) {  // a flood of refusals: close at once
    asio::write(socket, asio::buffer(refusal), ignored);
    socket.close(ignored);
    --refusing_;
    co_return;
  }
  auto shared = std::make_shared<tcp::socket>(std::move(socket));
  co_await asio::async_write(*shared, asio::buffer(refusal), tuple_awaitable);
  shared->shutdown(tcp::socket::shutdown_send, ignored);
  asio::steady_timer timer(shared->get_executor());
  timer.expires_after(1s);
  timer.async_wait([shared](std::error_code ec) {
    std::error_code e;
    if (!ec) shared->close(e);
  });
  std::array<char, 4096> sink;
  for (std::size_t drained = 0; drained < 64 * 1024;) {
    auto [ec, n] = co_await shared->async_read_some(asio::buffer(sink), tuple_awaitable);
    if (ec) break;
    drained += n;
  }
  timer.cancel();
  shared->close(ignored);
  --refusing_;
}

// Closes connections idle past --idle-timeout, and those that have not taken a reply batch of
// --client-output-limit bytes or more within --client-output-seconds.
asio::awaitable<void> Server::sweep() {
  asio::steady_timer timer(io_);
  const std::int64_t idle = std::int64_t{options_.idle_timeout} * 1'000'000'000;
  const std::int64_t stalled = std::int64_t{options_.client_output_seconds} * 1'000'000'000;
  for (;;) {
    timer.expires_after(100ms);
    auto [ec] = co_await timer.async_wait(tuple_awaitable);
    if (ec || !acceptor_.is_open()) co_return;
    for (const std::uint64_t gone : bindings_.sweep())
      service_.remove_peer(gone);
    const auto now = now_ns();
    std::lock_guard lock(connections_mutex_);
    for (const auto& connection : connections_) {
      const auto idle_since = connection->idle_since();
      const auto over_since = connection->output_over_since();
      if (idle > 0 && idle_since != 0 && now - idle_since >= idle && connection->sweep_once()) {
        ++counters_.closed_idle;
        connection->close();
      } else if (over_since != 0 && now - over_since >= stalled && connection->sweep_once()) {
        ++counters_.closed_output;
        connection->close();
      }
    }
  }
}

// Closes every connection; each ends once its current command's transfer has completed. A
// transfer that never completes would hold the process, so 5 s after the signal it exits regardless.
asio::awaitable<void> Server::stop() {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  std::error_code ignored;
  acceptor_.close(ignored);
  {
    std::lock_guard lock(connections_mutex_);
    for (const auto& connection : connections_)
      connection->close();
  }
  asio::steady_timer timer(io_);
  for (;;) {
    {
      std::lock_guard lock(connections_mutex_);
      if (connections_.empty()) co_return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    timer.expires_at(std::min(deadline, now + 10ms));
    co_await timer.async_wait(tuple_awaitable);
  }
  std::fprintf(stderr, "dma-kv-server: connections still busy 5 s after the stop signal; exiting\n");
  std::_Exit(1);
}

std::string Server::info() const {
  const auto uptime = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_);
  std::size_t connected = 0;
  {
    std::lock_guard lock(connections_mutex_);
    connected = connections_.size();
  }
  const std::string address = dma::encode_hex(service_.local_address());
  dma::kv::InfoFields fields;
  fields.server = "dma-kv-server";
  fields.provider = info_.provider;
  fields.fabric_address = address;
  fields.any_fabric_host = options_.allow_any_fabric_host;
  fields.max_value = options_.max_value;
  fields.confirmation = confirmation_;
  fields.dma_clients = counters_.dma_clients.load();
  fields.hellos = counters_.hellos.load();
  fields.hellos_rejected = counters_.hellos_rejected.load();
  fields.hello_bindings = bindings_.size();
  fields.hello_bindings_dropped = bindings_.dropped();
  fields.no_hello = counters_.no_hello.load();
  fields.outstanding = service_.outstanding();
  fields.sets_in_flight = counters_.sets_in_flight.load();
  fields.gets_in_flight = counters_.gets_in_flight.load();
  fields.transfers_ok = counters_.transfers_ok.load();
  fields.transfers_failed = counters_.transfers_failed.load();
  fields.transfers_timed_out = counters_.transfers_timed_out.load();
  fields.crc_mismatches = counters_.crc_mismatches.load();
  fields.bytes_read = counters_.bytes_read.load();
  fields.bytes_written = counters_.bytes_written.load();
  fields.gets_notified = counters_.gets_notified.load();
  fields.service = service_.metrics();
  using Section = dma::kv::InfoSection;
  return dma::kv::info_text(fields, [&](Section section, dma::kv::InfoText& t) {
    switch (section) {
      case Section::server:
        t.field("tcp_port", acceptor_.is_open() ? acceptor_.local_endpoint().port() : 0);
        t.field("threads", options_.threads);
        t.field("uptime_in_seconds", static_cast<std::uint64_t>(uptime.count()));
        break;
      case Section::clients:
        t.field("connected_clients", connected);
        t.field("total_connections_received", counters_.connections_total.load());
        t.field("rejected_connections", counters_.connections_rejected.load());
        t.field("max_clients", options_.max_clients);
        break;
      case Section::keyspace:
        t.field("keys", store_.keys());
        t.field("bytes_stored", store_.bytes());
        break;
      case Section::memory:
        t.field("value_memory", values_->used());
        t.field("max_memory", values_->limit());
        t.field("oom_replies", counters_.oom_replies.load());
        t.field("client_input_buffers", input_bytes_.load());
        t.field("client_output_buffers", output_bytes_.load());
        t.field("client_buffers", client_buffers_.used());
        t.field("max_client_buffers", client_buffers_.limit());
        t.field("client_output_limit", options_.client_output_limit);
        t.field("client_output_seconds", options_.client_output_seconds);
        t.field("idle_timeout", options_.idle_timeout);
        t.field("clients_closed_idle", counters_.closed_idle.load());
        t.field("clients_closed_output", counters_.closed_output.load());
        t.field("clients_closed_input", counters_.closed_input_budget.load());
        break;
      case Section::commands:
        t.field("commands_processed", counters_.commands.load());
        t.field("error_replies", counters_.error_replies.load());
        t.field("protocol_errors", counters_.protocol_errors.load());
        break;
      case Section::transfers:
      case Section::service:
        break;
    }
  });
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
  app.add_option("--max-memory", options.max_memory, "bytes of values the store holds at most")->capture_default_str();
  app.add_option("--max-clients", options.max_clients, "connections served at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-client-buffers", options.max_client_buffers,
                 "bytes of input and output buffers all connections hold at most")
      ->check(CLI::Range(std::size_t{1} << 20, SIZE_MAX))
      ->capture_default_str();
  app.add_option("--client-output-limit", options.client_output_limit,
                 "a connection that has not taken a reply batch of this many bytes or more ...")
      ->capture_default_str();
  app.add_option("--client-output-seconds", options.client_output_seconds, "... within this many seconds is closed")
      ->check(CLI::Range(1u, 86400u))
      ->capture_default_str();
  app.add_option("--idle-timeout", options.idle_timeout,
                 "seconds a connection may wait between requests before it is closed (0: never)")
      ->capture_default_str();
  app.add_option("--config", options.config, "TOML file whose [dma-libfabric] table configures the service");
  // The protocol's settings, as the module takes them (dma::kv::settings), checked by the protocol.
  std::vector<std::pair<std::string, std::string>> given;
  for (const auto& setting : dma::kv::settings) {
    const std::string name(setting.name);
    std::string names = "--" + name;
    if (name == "transfer-deadline-ms") names += ",--transfer-deadline";  // earlier spellings
    if (name == "hello-idle-seconds") names += ",--hello-idle";
    if (setting.flag) {
      app.add_flag_callback(
          names, [&given, name] { given.emplace_back(name, "yes"); }, std::string(setting.help));
    } else {
      app.add_option_function<std::string>(
             names, [&given, name](const std::string& value) { given.emplace_back(name, value); },
             std::string(setting.help))
          ->default_str(std::string(setting.fallback))
          ->type_name(name == "confirm-gets" ? "MODE" : "N");
    }
  }
  CLI11_PARSE(app, argc, argv);
  for (const auto& [name, value] : given) {
    if (const auto why = dma::kv::apply_setting(options, name, value); why && !why->empty()) {
      std::fprintf(stderr, "dma-kv-server: --%s\n", why->c_str());
      return 2;
    }
  }

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
    asio::co_spawn(io, server.sweep(), asio::detached);
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
