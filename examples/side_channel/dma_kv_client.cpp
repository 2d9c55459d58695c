// dma-kv-client: the side channel's client, on the library's dma::kv::Client. Each connection owns
// one registered bounce buffer, exposed through the process's one dma::Target; DMA.SET and DMA.GET
// name that buffer and the server reads or writes it. See docs/side-channel.md.
//   dma-kv-client --port P set KEY (--file F | --size N)
//   dma-kv-client --port P get KEY [--out F]
//   dma-kv-client --port P info
//   dma-kv-client --port P bench --clients N --sizes 4096,1M --ratio 1:1 --duration 5 [--json]
// With --cluster, --host/--port name any node of a Redis/Valkey Cluster running the dma module, and
// set, get and bench go through dma::kv::ClusterClient: each key to the node serving its slot.
#include <dma/dma.hpp>
#include <dma/kv/client.hpp>
#include <dma/kv/cluster_client.hpp>
#include <dma/kv/protocol.hpp>
#include <dma/kv/resp.hpp>

#include "pattern.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using asio::ip::tcp;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One plain RESP connection, for the inline arms of bench (SET and GET against this server and
// redis-server). A reply views the connection's buffer until the next command.
class RespConnection {
 public:
  RespConnection(tcp::socket socket, std::size_t max_bulk) : socket_(std::move(socket)) {
    limits_.max_bulk = max_bulk;
    limits_.max_request = max_bulk + 64 * 1024;
    buffer_.resize(64 * 1024);
    socket_.set_option(tcp::no_delay(true));
  }

  static asio::awaitable<RespConnection> connect(const std::string& host, std::uint16_t port, std::size_t max_bulk) {
    tcp::socket socket(co_await asio::this_coro::executor);
    co_await socket.async_connect(tcp::endpoint(asio::ip::make_address(host), port), asio::use_awaitable);
    co_return RespConnection(std::move(socket), max_bulk);
  }

  /// Sends a command (with `payload` as one more bulk argument when given) and reads its reply,
  /// whose strings view the connection's buffer until the next command.
  asio::awaitable<dma::kv::resp::Reply> command(std::span<const std::string> arguments,
                                                std::optional<std::span<const std::byte>> payload = std::nullopt) {
    discard_reply();
    out_.clear();
    dma::kv::resp::append_array_header(out_, arguments.size() + (payload ? 1 : 0));
    for (const auto& argument : arguments)
      dma::kv::resp::append_bulk(out_, argument);
    std::string header = payload ? dma::kv::resp::bulk_header(payload->size()) : std::string();
    out_ += header;
    std::array<asio::const_buffer, 3> buffers{
        asio::buffer(out_), payload ? asio::buffer(payload->data(), payload->size()) : asio::const_buffer(),
        asio::buffer("\r\n", payload ? 2 : 0)};
    co_await asio::async_write(socket_, buffers, asio::use_awaitable);
    for (;;) {
      const auto parsed =
          dma::kv::resp::parse_reply(std::string_view(buffer_.data() + begin_, end_ - begin_), limits_, reply_);
      if (parsed.status == dma::kv::resp::Status::complete) {
        pending_ = parsed.consumed;
        co_return std::move(reply_);
      }
      if (parsed.status == dma::kv::resp::Status::error) throw Failure("the server's reply: " + parsed.error);
      make_room(parsed.needed);
      const std::size_t n = co_await socket_.async_read_some(asio::buffer(buffer_.data() + end_, buffer_.size() - end_),
                                                             asio::use_awaitable);
      end_ += n;
    }
  }

 private:
  void discard_reply() {
    begin_ += std::exchange(pending_, 0);
    if (begin_ == end_) begin_ = end_ = 0;
  }
  void make_room(std::size_t needed) {
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (needed > buffer_.size() && needed <= limits_.max_request + 64 * 1024) buffer_.resize(needed);
    if (end_ == buffer_.size()) {
      if (buffer_.size() >= limits_.max_request + 64 * 1024) throw Failure("a reply larger than any value");
      buffer_.resize(buffer_.size() * 2);
    }
  }

  tcp::socket socket_;
  dma::kv::resp::Limits limits_;
  std::vector<char> buffer_;
  std::size_t begin_ = 0, end_ = 0, pending_ = 0;
  std::string out_;
  dma::kv::resp::Reply reply_;
};

std::string reply_text(const dma::kv::resp::Reply& reply) {
  using T = dma::kv::resp::Reply::Type;
  switch (reply.type) {
    case T::simple:
    case T::error:
    case T::bulk:
      return std::string(reply.text);
    case T::integer:
      return std::to_string(reply.integer);
    case T::nil:
      return "(nil)";
    case T::array:
      return "(array of " + std::to_string(reply.elements.size()) + ")";
  }
  return {};
}

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

void expect_ok(const dma::kv::resp::Reply& reply, std::string_view what) {
  if (reply.type != dma::kv::resp::Reply::Type::simple) throw Failure(std::string(what) + ": " + reply_text(reply));
}

struct Common {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6380;
  bool efa = false;
  bool host_given = false;          // --host on the command line: it overrides the file's bind
  bool cluster = false;             // --host/--port name a cluster node; keys go to their slot's node
  unsigned wait_replicas = 0;       // --wait: each DMA.SET waits for this many replicas
  bool read_from_replicas = false;  // --read-from-replicas: DMA.GETs go to replicas
  dma::Configuration file;          // --config's [dma-libfabric] table, or the defaults
};

// The file's configuration with the command line's overrides: --efa, and --host as the bind address
// unless the file sets one and --host was not given.
dma::Configuration fabric_configuration(const Common& common) {
  dma::Configuration configuration = common.file;
  if (common.efa) {
    configuration.providers = {dma::Provider::efa_direct};
    configuration.bind.reset();
  } else if (configuration.providers.empty() || configuration.providers.front() == dma::Provider::tcp) {
    if (common.host_given || !configuration.bind) configuration.bind = common.host;
  }
  return configuration;
}

// The longest a command may take (the Target's notification of a DMA.GET included): only a
// server that stopped answering reaches it.
constexpr auto command_deadline = std::chrono::seconds(60);

// A command's (error, result) as a coroutine awaits it; an error throws with the client's words.
constexpr auto with_error = dma::compat::as_tuple(asio::use_awaitable);

template <typename Result>
Result checked(std::tuple<std::error_code, Result> outcome) {
  auto& [ec, result] = outcome;
  if (ec) throw Failure(result.detail.empty() ? ec.message() : result.detail);
  return std::move(result);
}

// One dma::kv::Client (or, with --cluster, one dma::kv::ClusterClient: a connection per node)
// with its bounce buffer exposed once on the shared Target: every DMA.SET and DMA.GET names a part
// of that buffer, so no command registers memory.
class SideChannel {
 public:
  static asio::awaitable<std::unique_ptr<SideChannel>> open(const Common& common, dma::kv::ClientTarget& shared,
                                                            std::size_t capacity, bool verify_gets) {
    dma::kv::ClientOptions options;
    options.deadline = command_deadline;
    options.verify_gets = verify_gets;
    auto channel = std::unique_ptr<SideChannel>(new SideChannel(std::max<std::size_t>(capacity, 1)));
    channel->wait_replicas_ = common.wait_replicas;
    const auto executor = co_await asio::this_coro::executor;
    if (common.cluster) {
      dma::kv::ClusterOptions cluster_options;
      cluster_options.client = options;
      cluster_options.read_from_replicas = common.read_from_replicas;
      channel->cluster_.emplace(executor, shared, cluster_options);
      const auto [ec] = co_await channel->cluster_->async_connect(common.host, common.port, with_error);
      if (ec)
        throw Failure("reading the cluster's slot map from " + common.host + ":" + std::to_string(common.port) + ": " +
                      ec.message());
      channel->region_ = shared.target().expose(channel->buffer_);
      co_return channel;
    }
    channel->client_.emplace(executor, shared, options);
    const auto [ec] = co_await channel->client_->async_connect(common.host, common.port, with_error);
    if (ec) throw std::system_error(ec);
    channel->region_ = shared.target().expose(channel->buffer_);
    checked(co_await channel->client_->async_hello(with_error));
    co_return channel;
  }

  std::span<std::byte> buffer() noexcept { return buffer_; }
  /// What confirms a DMA.GET (a cluster's nodes run with the same module arguments).
  dma::kv::Confirmation confirmation() const {
    return client_ ? client_->hello()->confirmation : dma::kv::Confirmation::reply;
  }
  dma::kv::ClusterClient* cluster() noexcept { return cluster_ ? &*cluster_ : nullptr; }

  /// DMA.SET of the first `length` bytes of the buffer.
  asio::awaitable<void> set(std::string_view key, std::size_t length) {
    dma::kv::SetRequest request{key, std::span<const std::byte>(buffer_).first(length), &region_, {}};
    request.replicas = wait_replicas_;
    if (cluster_) {
      checked(co_await cluster_->async_set(request, with_error));
    } else {
      checked(co_await client_->async_set(request, with_error));
    }
  }

  /// DMA.GET into the buffer; returns, once the bytes are in the buffer, the value's length and the
  /// server's CRC-32C of it.
  asio::awaitable<std::pair<std::size_t, std::uint32_t>> get(std::string_view key) {
    const dma::kv::GetRequest request{key, buffer_, &region_, {}};
    dma::kv::GetResult result;  // no co_await inside ?: (g++ 12 destroys its temporaries twice)
    if (cluster_) {
      result = checked(co_await cluster_->async_get(request, with_error));
    } else {
      result = checked(co_await client_->async_get(request, with_error));
    }
    co_return std::pair{static_cast<std::size_t>(result.length), result.crc};
  }

 private:
  explicit SideChannel(std::size_t capacity) : buffer_(capacity) {}

  std::optional<dma::kv::Client> client_;
  std::optional<dma::kv::ClusterClient> cluster_;
  unsigned wait_replicas_ = 0;
  std::vector<std::byte> buffer_;
  dma::Target::Region region_;
};

// Runs body on a fresh io_context with a Target (shared by the body's clients) on it; rethrows what
// body throws. The Target's progress and the clients share the one thread.
template <typename Body>
void run_with_target(const Common& common, Body body) {
  asio::io_context io;
  dma::Target target(io, fabric_configuration(common));
  dma::kv::ClientTarget shared(target);
  std::exception_ptr failure;
  asio::co_spawn(io, body(shared), [&](std::exception_ptr e) {
    failure = e;
    io.stop();  // the target's progress keeps the context busy
  });
  io.run();
  if (failure) std::rethrow_exception(failure);
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Failure("cannot open " + path);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

int command_set(const Common& common, const std::string& key, const std::optional<std::string>& file,
                std::optional<std::size_t> size) {
  std::vector<std::byte> value;
  if (file) {
    value = read_file(*file);
  } else {
    const kv::Pattern pattern(*size);
    const auto bytes = pattern.value(kv::seed_of(key), *size);
    value.assign(bytes.begin(), bytes.end());
  }
  run_with_target(common, [&](dma::kv::ClientTarget& shared) -> asio::awaitable<void> {
    auto channel = co_await SideChannel::open(common, shared, value.size(), true);
    std::copy(value.begin(), value.end(), channel->buffer().begin());
    co_await channel->set(key, value.size());
  });
  std::printf("stored %s: %zu bytes, crc32c %u\n", key.c_str(), value.size(), dma::checksum(value));
  return 0;
}

int command_get(const Common& common, const std::string& key, const std::optional<std::string>& out,
                std::size_t capacity) {
  std::vector<std::byte> value;
  std::uint32_t server_crc = 0;
  // The CRC is checked below, so that a mismatch names the server's.
  run_with_target(common, [&](dma::kv::ClientTarget& shared) -> asio::awaitable<void> {
    auto channel = co_await SideChannel::open(common, shared, capacity, false);
    const auto [length, crc] = co_await channel->get(key);
    value.assign(channel->buffer().begin(), channel->buffer().begin() + static_cast<std::ptrdiff_t>(length));
    server_crc = crc;
  });
  const auto crc = dma::checksum(value);
  std::printf("%s: %zu bytes, crc32c %u\n", key.c_str(), value.size(), crc);
  if (crc != server_crc) {
    std::fprintf(stderr, "error: the server's crc32c of the value is %u\n", server_crc);
    return 1;
  }
  const kv::Pattern pattern(value.size());
  if (same_bytes(value, pattern.value(kv::seed_of(key), value.size()))) {
    std::printf("the bytes are the pattern `set %s --size %zu` writes\n", key.c_str(), value.size());
  }
  if (out) {
    std::ofstream file(*out, std::ios::binary);
    file.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
    if (!file) throw Failure("cannot write " + *out);
  }
  return 0;
}

int command_info(const Common& common) {
  asio::io_context io;
  dma::kv::Client client(io.get_executor());  // DMA.INFO needs no Target
  std::string text;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        const auto [ec] = co_await client.async_connect(common.host, common.port, with_error);
        if (ec) throw std::system_error(ec);
        text = checked(co_await client.async_info(with_error)).text;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

// ---- bench ----------------------------------------------------------------------------------

enum class Arm { dma, inline_kv, inline_redis };

const char* arm_name(Arm arm) {
  switch (arm) {
    case Arm::dma:
      return "dma";
    case Arm::inline_kv:
      return "inline";
    case Arm::inline_redis:
      return "redis";
  }
  return "?";
}

// One entry of --sizes: a fixed size, or `lo-hi` drawn log-uniformly.
struct SizeRange {
  std::size_t low = 0;
  std::size_t high = 0;
};

std::size_t parse_size(std::string text) {
  std::size_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'k':
      case 'K':
        scale = std::size_t{1} << 10;
        break;
      case 'm':
      case 'M':
        scale = std::size_t{1} << 20;
        break;
      default:
        break;
    }
    if (scale != 1) text.pop_back();
  }
  const auto value = dma::parse_u64(text);
  if (!value || *value > (std::size_t{1} << 40) / scale) throw Failure("invalid size '" + text + "'");
  return static_cast<std::size_t>(*value) * scale;
}

std::vector<SizeRange> parse_sizes(const std::string& spec) {
  std::vector<SizeRange> sizes;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    const auto dash = item.find('-');
    SizeRange range;
    range.low = parse_size(item.substr(0, dash));
    range.high = dash == std::string::npos ? range.low : parse_size(item.substr(dash + 1));
    if (range.high < range.low) throw Failure("size range '" + item + "' runs backwards");
    sizes.push_back(range);
  }
  if (sizes.empty()) throw Failure("--sizes names no size");
  return sizes;
}

struct BenchOptions {
  unsigned clients = 8;
  std::string sizes = "1M";
  std::string ratio = "1:1";
  double duration = 5;
  std::size_t ops = 0;  ///< per client; when set, replaces --duration
  unsigned keys = 8;    ///< per client
  std::string arms = "dma,inline,redis";
  bool arms_given = false;  ///< --arms on the command line
  std::string redis_server = "redis-server";
  std::string key_prefix = "bench";
  bool json = false;
  std::uint64_t seed = 1;
};

struct ArmResult {
  Arm arm{};
  std::uint64_t gets = 0, sets = 0, bytes = 0, errors = 0, mismatches = 0;
  std::uint64_t notified = 0;  ///< GETs whose bytes a notification confirmed (not the reply)
  double seconds = 0;
  std::vector<float> latencies_us;
  std::string first_error;
  std::map<std::string, std::uint64_t> keys_per_node;  ///< --cluster: the primary each key went to
  dma::kv::ClusterStats cluster;                       ///< --cluster: summed over the clients

  double percentile(double p) {
    if (latencies_us.empty()) return 0;
    const auto at = static_cast<std::size_t>(p * static_cast<double>(latencies_us.size() - 1));
    std::nth_element(latencies_us.begin(), latencies_us.begin() + static_cast<std::ptrdiff_t>(at), latencies_us.end());
    return latencies_us[at];
  }
};

// What one bench client knows about the keys it wrote.
struct Written {
  std::uint64_t seed = 0;
  std::size_t length = 0;
};

class Bench {
 public:
  Bench(const BenchOptions& options, const Common& common)
      : options_(options), common_(common), sizes_(parse_sizes(options.sizes)) {
    const auto colon = options.ratio.find(':');
    const auto gets = dma::parse_u64(options.ratio.substr(0, colon));
    const auto sets = colon == std::string::npos ? std::nullopt : dma::parse_u64(options.ratio.substr(colon + 1));
    if (!gets || !sets || *gets + *sets == 0) throw Failure("--ratio wants get:set, e.g. 1:1, got " + options.ratio);
    get_share_ = static_cast<double>(*gets) / static_cast<double>(*gets + *sets);
    for (const auto& s : sizes_)
      max_size_ = std::max(max_size_, s.high);
    pattern_.emplace(max_size_);
  }

  ArmResult run(Arm arm, std::uint16_t port) {
    ArmResult result;
    result.arm = arm;
    asio::io_context io;
    std::optional<dma::Target> target;
    std::optional<dma::kv::ClientTarget> shared;  // one for every client: they share the Target
    if (arm == Arm::dma) {
      target.emplace(io, fabric_configuration(common_));
      shared.emplace(*target);
    }
    unsigned running = options_.clients;
    const auto start = Clock::now();
    deadline_ = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.duration));
    for (unsigned i = 0; i < options_.clients; ++i) {
      asio::co_spawn(io, client(arm, port, shared ? &*shared : nullptr, i, result), [&](std::exception_ptr e) {
        if (e) {
          ++result.errors;
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& error) {
            if (result.first_error.empty()) result.first_error = error.what();
          }
        }
        if (--running == 0) io.stop();
      });
    }
    io.run();
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return result;
  }

  const BenchOptions& options() const noexcept { return options_; }

 private:
  std::size_t draw_size(std::mt19937_64& rng) const {
    const auto& range = sizes_[rng() % sizes_.size()];
    if (range.low == range.high) return range.low;
    const double lo = std::log(static_cast<double>(std::max<std::size_t>(range.low, 1)));
    const double hi = std::log(static_cast<double>(range.high) + 1);
    const auto n = static_cast<std::size_t>(std::exp(std::uniform_real_distribution<double>(lo, hi)(rng)));
    return std::clamp(n, range.low, range.high);
  }

  bool more(std::size_t done) const { return options_.ops > 0 ? done < options_.ops : Clock::now() < deadline_; }

  asio::awaitable<void> client(Arm arm, std::uint16_t port, dma::kv::ClientTarget* shared, unsigned index,
                               ArmResult& result) {
    std::mt19937_64 rng(options_.seed * 1000003 + index);
    std::unique_ptr<SideChannel> channel;
    std::optional<RespConnection> resp;
    if (arm == Arm::dma) {
      Common common = common_;
      common.port = port;
      channel = co_await SideChannel::open(common, *shared, max_size_, false);  // the bytes are compared below
    } else {
      resp.emplace(co_await RespConnection::connect(common_.host, port, max_size_));
    }
    std::vector<std::optional<Written>> keys(std::max(1u, options_.keys));
    std::vector<std::string> names;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      names.push_back(options_.key_prefix + ":" + std::to_string(index) + ":" + std::to_string(k));
      if (channel && channel->cluster()) ++result.keys_per_node[channel->cluster()->node_of(names.back())];
    }
    struct AddStats {
      SideChannel* channel;
      ArmResult& result;
      ~AddStats() {
        if (channel == nullptr || channel->cluster() == nullptr) return;
        const auto s = channel->cluster()->stats();
        result.cluster.moved += s.moved;
        result.cluster.asked += s.asked;
        result.cluster.retries += s.retries;
        result.cluster.refreshes += s.refreshes;
        result.cluster.connections += s.connections;
        result.cluster.replica_reads += s.replica_reads;
      }
    } add_stats{channel.get(), result};
    std::uint64_t version = 0;
    for (std::size_t done = 0; more(done); ++done) {
      const std::size_t k = rng() % keys.size();
      const bool get = keys[k] && std::uniform_real_distribution<double>(0, 1)(rng) < get_share_;
      const auto began = Clock::now();
      std::size_t bytes = 0;
      if (get) {
        const auto& written = *keys[k];
        const auto expected = pattern_->value(written.seed, written.length);
        if (channel) {
          const auto [length, crc] = co_await channel->get(names[k]);
          (void)crc;
          if (length != written.length || !same_bytes(channel->buffer().first(length), expected)) {
            ++result.mismatches;
          }
          if (channel->confirmation() == dma::kv::Confirmation::notification && length > 0) ++result.notified;
        } else {
          const std::vector<std::string> arguments{"GET", names[k]};
          const auto reply = co_await resp->command(arguments);
          if (reply.type != dma::kv::resp::Reply::Type::bulk ||
              !same_bytes(std::as_bytes(std::span(reply.text)), expected)) {
            ++result.mismatches;
          }
        }
        bytes = written.length;
        ++result.gets;
      } else {
        const Written next{(static_cast<std::uint64_t>(index) << 40) + ++version, draw_size(rng)};
        const auto value = pattern_->value(next.seed, next.length);
        if (channel) {
          std::memcpy(channel->buffer().data(), value.data(), value.size());
          co_await channel->set(names[k], next.length);
        } else {
          const std::vector<std::string> arguments{"SET", names[k]};
          expect_ok(co_await resp->command(arguments, value), "SET");
        }
        keys[k] = next;
        bytes = next.length;
        ++result.sets;
      }
      result.bytes += bytes;
      result.latencies_us.push_back(std::chrono::duration<float, std::micro>(Clock::now() - began).count());
    }
  }

  BenchOptions options_;
  Common common_;
  std::vector<SizeRange> sizes_;
  std::size_t max_size_ = 1;
  double get_share_ = 0.5;
  std::optional<kv::Pattern> pattern_;
  Clock::time_point deadline_;
};

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

bool on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::stringstream in(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(in, dir, ':');) {
    if (access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::uint16_t free_port() {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  return acceptor.local_endpoint().port();
}

// A redis-server of its own on a free loopback port, without persistence; stopped by its PID.
class RedisServer {
 public:
  RedisServer(const std::string& program, std::size_t max_value) {
    for (int attempt = 0; attempt < 5 && pid_ <= 0; ++attempt) {
      port_ = free_port();
      std::vector<std::string> arguments{program,
                                         "--port",
                                         std::to_string(port_),
                                         "--bind",
                                         "127.0.0.1",
                                         "--save",
                                         "",
                                         "--appendonly",
                                         "no",
                                         "--protected-mode",
                                         "no",
                                         "--proto-max-bulk-len",
                                         std::to_string(std::max<std::size_t>(max_value, 1 << 20) + 1024),
                                         "--logfile",
                                         ""};
      std::vector<char*> argv;
      for (auto& a : arguments)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      const pid_t pid = fork();
      if (pid < 0) throw Failure(std::string("fork: ") + std::strerror(errno));
      if (pid == 0) {
        // The server goes with this process, however it ends; its chatter goes nowhere.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        const int null = open("/dev/null", O_RDWR);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        execvp(argv[0], argv.data());
        _exit(127);
      }
      if (ready(pid)) {
        pid_ = pid;
      } else {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    if (pid_ <= 0) throw Failure(program + " did not start answering PING on a loopback port");
  }
  ~RedisServer() {
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 500 && waitpid(pid_, &status, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(10ms);
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
  }
  std::uint16_t port() const noexcept { return port_; }

 private:
  // Polls PING for up to 5 s, giving up at once if the process exits.
  bool ready(pid_t pid) {
    for (int i = 0; i < 250; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return false;
      try {
        asio::io_context io;
        tcp::socket socket(io);
        socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_));
        asio::write(socket, asio::buffer(std::string_view("PING\r\n")));
        char reply[16] = {};
        const auto n = socket.read_some(asio::buffer(reply));
        if (std::string_view(reply, n).starts_with("+PONG")) return true;
      } catch (const std::system_error&) {
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
};

int command_bench(const Common& common, const BenchOptions& options) {
  std::vector<Arm> arms;
  std::stringstream in(common.cluster && !options.arms_given ? std::string("dma") : options.arms);
  for (std::string item; std::getline(in, item, ',');) {
    if (item == "dma") {
      arms.push_back(Arm::dma);
    } else if (item == "inline") {
      arms.push_back(Arm::inline_kv);
    } else if (item == "redis") {
      arms.push_back(Arm::inline_redis);
    } else {
      throw Failure("unknown arm '" + item + "' (dma, inline, redis)");
    }
  }
  if (arms.empty()) throw Failure("--arms names no arm");
  if (common.cluster && (arms.size() != 1 || arms.front() != Arm::dma)) {
    throw Failure("--cluster measures the side channel alone: --arms dma");
  }
  Bench bench(options, common);
  const bool with_redis = std::ranges::find(arms, Arm::inline_redis) != arms.end();
  if (with_redis && !on_path(options.redis_server)) {
    throw Failure(options.redis_server +
                  " not found: install it (apt-get install redis-server), point --redis-server at it, or leave it out "
                  "with --arms dma,inline");
  }
  std::optional<RedisServer> redis;
  if (with_redis) redis.emplace(options.redis_server, parse_sizes(options.sizes).back().high);

  std::vector<ArmResult> results;
  for (const Arm arm : arms)
    results.push_back(bench.run(arm, arm == Arm::inline_redis ? redis->port() : common.port));

  std::uint64_t failures = 0;
  if (options.json) {
    std::printf("{\"clients\": %u, \"sizes\": \"%s\", \"ratio\": \"%s\", \"arms\": [", options.clients,
                options.sizes.c_str(), options.ratio.c_str());
  } else {
    std::printf("%u clients, sizes %s, get:set %s, %s\n", options.clients, options.sizes.c_str(), options.ratio.c_str(),
                options.ops > 0 ? (std::to_string(options.ops) + " operations per client").c_str()
                                : (seconds_text(options.duration) + " s per arm").c_str());
    std::printf("%-8s %10s %12s %9s %10s %10s %8s %10s\n", "arm", "ops", "ops/s", "GB/s", "p50 us", "p99 us", "errors",
                "mismatches");
  }
  for (std::size_t i = 0; i < results.size(); ++i) {
    auto& r = results[i];
    const std::uint64_t ops = r.gets + r.sets;
    const double ops_per_s = static_cast<double>(ops) / r.seconds;
    const double gbps = static_cast<double>(r.bytes) / r.seconds / 1e9;
    const double p50 = r.percentile(0.5), p99 = r.percentile(0.99);
    failures += r.errors + r.mismatches;
    if (options.json) {
      std::printf(
          "%s{\"arm\": \"%s\", \"ops\": %llu, \"gets\": %llu, \"sets\": %llu, \"bytes\": %llu, "
          "\"seconds\": %.3f, \"ops_per_s\": %.1f, \"gb_per_s\": %.4f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
          "\"errors\": %llu, \"mismatches\": %llu, \"notified\": %llu}",
          i ? ", " : "", arm_name(r.arm), static_cast<unsigned long long>(ops), static_cast<unsigned long long>(r.gets),
          static_cast<unsigned long long>(r.sets), static_cast<unsigned long long>(r.bytes), r.seconds, ops_per_s, gbps,
          p50, p99, static_cast<unsigned long long>(r.errors), static_cast<unsigned long long>(r.mismatches),
          static_cast<unsigned long long>(r.notified));
    } else {
      std::printf("%-8s %10llu %12.0f %9.3f %10.0f %10.0f %8llu %10llu\n", arm_name(r.arm),
                  static_cast<unsigned long long>(ops), ops_per_s, gbps, p50, p99,
                  static_cast<unsigned long long>(r.errors), static_cast<unsigned long long>(r.mismatches));
    }
    if (!r.first_error.empty()) std::fprintf(stderr, "%s: first error: %s\n", arm_name(r.arm), r.first_error.c_str());
    if (common.cluster && !options.json) {
      std::printf("keys per primary:");
      for (const auto& [node, count] : r.keys_per_node)
        std::printf(" %s=%llu", node.empty() ? "(none)" : node.c_str(), static_cast<unsigned long long>(count));
      std::printf("\ncluster: %llu MOVED, %llu ASK, %llu retries, %llu slot-map readings, %llu node connections\n",
                  static_cast<unsigned long long>(r.cluster.moved), static_cast<unsigned long long>(r.cluster.asked),
                  static_cast<unsigned long long>(r.cluster.retries),
                  static_cast<unsigned long long>(r.cluster.refreshes),
                  static_cast<unsigned long long>(r.cluster.connections));
    }
  }
  if (options.json) {
    std::printf("]}\n");
  } else {
    std::uint64_t gets = 0, notified = 0;
    for (const auto& r : results) {
      gets += r.gets;
      notified += r.notified;
    }
    if (failures == 0) {
      std::printf("verified: all %llu GETs returned every byte that was written\n",
                  static_cast<unsigned long long>(gets));
      if (notified > 0) {
        std::printf("(%llu of them read after the Target's notification, as the server asked)\n",
                    static_cast<unsigned long long>(notified));
      }
    } else {
      std::printf("FAILED: %llu errors or mismatched values\n", static_cast<unsigned long long>(failures));
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Common common;
  CLI::App app{"dma-kv-client: the side channel's client (dma-kv-server)"};
  app.add_option("--host", common.host, "the server's address (RESP and fabric)")->capture_default_str();
  app.add_option("--port", common.port, "the server's RESP port")->capture_default_str();
  app.add_flag("--efa", common.efa, "use efa-direct instead of tcp");
  app.add_flag("--cluster", common.cluster,
               "--host/--port name any node of a cluster; every key goes to the node serving its slot");
  app.add_option("--wait", common.wait_replicas,
                 "each DMA.SET succeeds once this many replicas hold the value (WAIT), else fails")
      ->check(CLI::Range(0u, 64u));
  app.add_flag("--read-from-replicas", common.read_from_replicas,
               "--cluster: DMA.GETs go to a replica of the key's slot (READONLY)");
  std::string config;
  app.add_option("--config", config,
                 "TOML file whose [dma-libfabric] table configures the client's target; --efa and --host override it");
  app.require_subcommand(1);

  std::string key;
  std::optional<std::string> file, out;
  std::optional<std::size_t> size;
  auto* set = app.add_subcommand("set", "store a value through the side channel (DMA.SET)");
  set->add_option("key", key, "the key")->required();
  auto* file_option = set->add_option("--file", file, "the value is this file's contents");
  set->add_option("--size", size, "the value is N bytes of the key's deterministic pattern")->excludes(file_option);
  std::size_t capacity = 0;
  auto* get = app.add_subcommand("get", "fetch a value through the side channel (DMA.GET)");
  get->add_option("key", key, "the key")->required();
  get->add_option("--out", out, "write the value to this file");
  get->add_option("--capacity", capacity, "the bounce buffer's size (default: 16 MiB)");
  auto* info = app.add_subcommand("info", "print the server's DMA.INFO");
  BenchOptions bench;
  auto* bench_command = app.add_subcommand("bench", "load test: the side channel, inline RESP, and redis-server");
  bench_command->add_option("--clients", bench.clients, "connections")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  bench_command->add_option("--sizes", bench.sizes, "value sizes: N, NK, NM, or a range lo-hi drawn log-uniformly")
      ->capture_default_str();
  bench_command->add_option("--ratio", bench.ratio, "gets to sets")->capture_default_str();
  bench_command->add_option("--duration", bench.duration, "seconds per arm")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench_command->add_option("--ops", bench.ops, "operations per client per arm (instead of --duration)");
  bench_command->add_option("--keys", bench.keys, "keys per client")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  bench_command->add_option("--arms", bench.arms, "what to measure: dma, inline (this server), redis")
      ->capture_default_str();
  bench_command->add_option("--redis-server", bench.redis_server, "the redis-server program")->capture_default_str();
  bench_command->add_option("--key-prefix", bench.key_prefix, "prefix of the keys")->capture_default_str();
  bench_command->add_option("--seed", bench.seed, "random seed")->capture_default_str();
  bench_command->add_flag("--json", bench.json, "print JSON instead of a table");
  CLI11_PARSE(app, argc, argv);
  common.host_given = app.count("--host") != 0;
  bench.arms_given = bench_command->count("--arms") != 0;
  if (common.read_from_replicas && !common.cluster) {
    std::fprintf(stderr, "dma-kv-client: --read-from-replicas needs --cluster\n");
    return 2;
  }
  if (!config.empty()) {
    try {
      common.file = dma::Configuration::from_toml(config);
    } catch (const dma::ConfigurationError& error) {
      std::fprintf(stderr, "dma-kv-client: --config: %s\n", error.what());
      return 2;
    }
  }

  try {
    if (set->parsed()) {
      if (!file && !size) throw Failure("set needs --file F or --size N");
      return command_set(common, key, file, size);
    }
    if (get->parsed()) return command_get(common, key, out, capacity > 0 ? capacity : std::size_t{16} << 20);
    if (info->parsed()) return command_info(common);
    return command_bench(common, bench);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
