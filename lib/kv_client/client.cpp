#include "dma/kv/client.hpp"

#include "dma/advertisement.hpp"
#include "dma/checksum.hpp"
#include "dma/error.hpp"
#include "dma/kv/resp.hpp"

#include <asio/bind_executor.hpp>
#include <asio/connect.hpp>
#include <asio/dispatch.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <variant>

namespace dma::kv {
namespace {

class ClientCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "dma.kv.client"; }
  std::string message(int value) const override {
    switch (static_cast<client_error>(value)) {
      case client_error::not_connected:
        return "not connected to a server";
      case client_error::server_gone:
        return "the server closed the connection";
      case client_error::protocol_error:
        return "the server's reply breaks the protocol";
      case client_error::no_hello:
        return "the server has no DMA.HELLO for this client";
      case client_error::transfer_failed:
        return "the server's transfer failed";
      case client_error::crc_mismatch:
        return "CRC-32C mismatch";
      case client_error::no_such_key:
        return "no such key";
      case client_error::buffer_too_small:
        return "the buffer is smaller than the value";
      case client_error::value_too_large:
        return "the value is over the server's limit";
      case client_error::try_again:
        return "the server asks to try again";
      case client_error::cluster_down:
        return "the cluster is down";
      case client_error::out_of_memory:
        return "the server is out of memory";
      case client_error::wrong_type:
        return "the key holds the wrong kind of value";
      case client_error::redirected:
        return "the key lives on another node";
      case client_error::server_error:
        return "the server answered with an error";
      case client_error::timed_out:
        return "the command's deadline passed";
      case client_error::aborted:
        return "the connection closed under the command";
      case client_error::notification_missing:
        return "the Target's notification of a DMA.GET did not come";
      case client_error::invalid_argument:
        return "invalid argument";
      case client_error::registration_failed:
        return "exposing the command's bytes failed";
      case client_error::not_replicated:
        return "the value is stored, but not on as many replicas as asked";
    }
    return "unknown dma.kv.client error " + std::to_string(value);
  }
};

using Clock = std::chrono::steady_clock;
using asio::ip::tcp;

std::string milliseconds_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace

const std::error_category& client_category() noexcept {
  static const ClientCategory category;
  return category;
}

client_error error_of_reply(std::string_view text) noexcept {
  switch (classify_error(text)) {
    case ErrorReply::no_hello:
      return client_error::no_hello;
    case ErrorReply::try_again:
      return client_error::try_again;
    case ErrorReply::cluster_down:
      return client_error::cluster_down;
    case ErrorReply::out_of_memory:
      return client_error::out_of_memory;
    case ErrorReply::wrong_type:
      return client_error::wrong_type;
    case ErrorReply::moved:
    case ErrorReply::ask:
      return client_error::redirected;
    case ErrorReply::no_such_key:
      return client_error::no_such_key;
    case ErrorReply::transfer_failed:
      return client_error::transfer_failed;
    case ErrorReply::crc_mismatch:
      return client_error::crc_mismatch;
    case ErrorReply::value_too_large:
      return client_error::value_too_large;
    case ErrorReply::buffer_too_small:
      return client_error::buffer_too_small;
    case ErrorReply::other:
      break;
  }
  return client_error::server_error;
}

// ---- ClientTarget ----------------------------------------------------------------------------

struct ClientTarget::State {
  explicit State(Target& t) : target(t), insert_server(t.describe().provider.starts_with("efa")) {}

  /// Called once the notification with a waited-for token arrived (true) or was dropped (false).
  using Waiter = std::function<void(bool landed)>;

  std::uint32_t issue() {
    std::lock_guard lock(mutex);
    while (next == 0 || pending.contains(next))
      ++next;
    pending.emplace(next, Entry{});
    return next++;
  }

  void forget(std::uint32_t token) {
    std::lock_guard lock(mutex);
    pending.erase(token);
  }

  /// Runs `waiter` once the token's notification is in (at once, here, if it already is).
  void wait(std::uint32_t token, Waiter waiter) {
    std::unique_lock lock(mutex);
    const auto it = pending.find(token);
    if (it == pending.end()) {
      lock.unlock();
      waiter(false);
      return;
    }
    if (it->second.state != Entry::waiting) {
      const bool landed = it->second.state == Entry::landed;
      pending.erase(it);
      lock.unlock();
      waiter(landed);
      return;
    }
    it->second.waiter = std::move(waiter);
  }

  // On the Target's executor.
  void arrived(std::error_code ec, const WriteNotification& notification) {
    std::vector<std::pair<Waiter, bool>> ready;
    {
      std::lock_guard lock(mutex);
      if (ec == dma::errc::notifications_lost) {
        for (auto it = pending.begin(); it != pending.end();) {
          if (it->second.waiter) {
            ready.emplace_back(std::move(it->second.waiter), false);
            it = pending.erase(it);
          } else {
            it->second.state = Entry::lost;
            ++it;
          }
        }
      } else if (!ec) {
        const auto it = notification.data <= max_token ? pending.find(static_cast<std::uint32_t>(notification.data))
                                                       : pending.end();
        if (it == pending.end() || it->second.state != Entry::waiting) {
          strays.fetch_add(1, std::memory_order_relaxed);
        } else if (it->second.waiter) {
          ready.emplace_back(std::move(it->second.waiter), true);
          pending.erase(it);
        } else {
          it->second.state = Entry::landed;
        }
      }
    }
    for (auto& [waiter, landed] : ready)
      waiter(landed);
  }

  struct Entry {
    enum { waiting, landed, lost } state = waiting;
    Waiter waiter;
  };

  Target& target;
  const bool insert_server;  ///< efa: the Target must know the server's address before it writes
  std::mutex mutex;
  std::unordered_map<std::uint32_t, Entry> pending;
  std::uint32_t next = 1;
  std::atomic<std::uint64_t> strays{0};
};

ClientTarget::ClientTarget(Target& target) : state_(std::make_shared<State>(target)) {
  target.set_notification_callback([state = state_](std::error_code ec, const WriteNotification& notification) {
    state->arrived(ec, notification);
  });
}

ClientTarget::~ClientTarget() { state_->target.set_notification_callback({}); }

Target& ClientTarget::target() const noexcept { return state_->target; }

std::uint64_t ClientTarget::strays() const noexcept { return state_->strays.load(std::memory_order_relaxed); }

// ---- Client ----------------------------------------------------------------------------------

namespace {

enum class Kind { hello, set, get, info, command, asking, wait };

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::command:
      return "command";
    case Kind::asking:
      return "ASKING";
    case Kind::wait:
      return "WAIT";
    case Kind::hello:
      return "DMA.HELLO";
    case Kind::set:
      return "DMA.SET";
    case Kind::get:
      return "DMA.GET";
    case Kind::info:
      return "DMA.INFO";
  }
  return "?";
}

// A command sent and not completed.
struct Pending {
  Kind kind = Kind::info;
  std::uint64_t id = 0;
  Clock::time_point deadline = Clock::time_point::max();
  std::chrono::milliseconds deadline_length{0};
  std::variant<detail::CompletionPtr<HelloResult>, detail::CompletionPtr<SetResult>, detail::CompletionPtr<GetResult>,
               detail::CompletionPtr<InfoResult>, detail::CompletionPtr<CommandResult>>
      completion;
  std::string name;  ///< async_command: the command's name
  // DMA.SET and DMA.GET
  std::optional<Target::Region> owned;  ///< the bytes exposed for this command alone
  std::uint64_t length = 0;             ///< DMA.SET: the value's; DMA.GET: from the reply
  std::uint32_t crc = 0;                ///< DMA.SET: sent; DMA.GET: from the reply
  std::span<std::byte> into;            ///< DMA.GET
  std::optional<std::uint32_t> token;   ///< DMA.GET under notification confirmation
  bool abandoned = false;               ///< completed by a cancellation; its reply is dropped
  // DMA.SET with SetRequest::replicas: the WAIT sent right behind it takes its completion over.
  unsigned replicas = 0;
  std::chrono::milliseconds replica_timeout{0};
};

// What a command is called in its result's detail.
std::string label(const Pending& command) {
  if (command.kind == Kind::command) return command.name;
  if (command.kind == Kind::wait) return "DMA.SET";  // a WAIT that took a DMA.SET over
  return kind_name(command.kind);
}

}  // namespace

namespace {

// Where `bytes` lie in `region`'s remote view, or an error text.
std::string window_in(const Target::Region& region, std::span<const std::byte> bytes, Window& window) {
  const auto all = region.bytes();
  const auto* first = reinterpret_cast<const std::byte*>(all.data());
  if (!region) return "the region is empty";
  if (bytes.data() < first || bytes.data() + bytes.size() > first + all.size()) {
    return "the bytes (" + std::to_string(bytes.size()) + ") do not lie inside the region (" +
           std::to_string(all.size()) + " bytes)";
  }
  const auto& advertisement = region.advertisement();
  window.rkey = advertisement.remote_key;
  window.address = advertisement.remote_address + static_cast<std::uint64_t>(bytes.data() - first);
  window.length = bytes.size();
  return {};
}

// Why a data command cannot be sent, or nothing.
struct Refusal {
  client_error error{};
  std::string detail;
};

}  // namespace

struct Client::Impl : std::enable_shared_from_this<Impl> {
  Impl(const executor_type& executor, std::shared_ptr<ClientTarget::State> t, const ClientOptions& o)
      : strand(asio::make_strand(executor)),
        target(std::move(t)),
        options(o),
        resolver(strand),
        socket(strand),
        timer(strand) {
    limits.max_bulk = std::max<std::size_t>(options.max_reply, 1024);
    limits.max_arguments = std::size_t{1} << 16;  // a reply's arrays: CLUSTER SLOTS lists up to 16384 ranges
    limits.max_request = limits.max_bulk + (std::size_t{64} << 10);
    in.resize(std::size_t{64} << 10);
  }

  // ---- completing -----------------------------------------------------------------------------

  template <typename Result>
  static void complete(detail::CompletionPtr<Result>& completion, std::error_code ec, Result result) {
    if (completion) detail::finish(std::move(completion), ec, std::move(result));
  }

  template <typename Result>
  static void complete_with(detail::CompletionPtr<Result>& completion, std::error_code ec, std::string&& detail) {
    Result result;
    result.detail = std::move(detail);
    complete(completion, ec, std::move(result));
  }

  /// Fails a command: its own bytes are closed to the server first, its token forgotten.
  void fail(Pending& command, std::error_code ec, std::string detail) {
    command.owned.reset();
    if (command.token && target) target->forget(*command.token);
    command.token.reset();
    if (command.abandoned) return;  // its handler has run
    pending_count.fetch_sub(1, std::memory_order_relaxed);
    std::visit([&](auto& completion) { complete_with(completion, ec, std::move(detail)); }, command.completion);
  }

  /// Fails a command refused before it was sent.
  template <typename Result>
  void fail_now(detail::CompletionPtr<Result> completion, std::error_code ec, std::string detail) {
    pending_count.fetch_sub(1, std::memory_order_relaxed);
    complete_with(completion, ec, std::move(detail));
  }

  /// Completes a command with its result.
  template <typename Result>
  void succeed(Pending& command, Result result) {
    pending_count.fetch_sub(1, std::memory_order_relaxed);
    complete(std::get<detail::CompletionPtr<Result>>(command.completion), {}, std::move(result));
  }

  std::optional<Refusal> prepare(Pending& command, std::span<std::byte> bytes, const Target::Region* region,
                                 Target::Access access, HelloReply& named, Window& window);

  // ---- the connection ---------------------------------------------------------------------

  /// Closes the connection and fails every pending command: those past their deadline with
  /// timed_out, the others with `ec` and `detail`.
  void close_connection(std::error_code ec, const std::string& detail) {
    ++generation;
    open.store(false, std::memory_order_relaxed);
    {
      std::lock_guard lock(hello_mutex);
      hello.reset();
    }
    std::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    resolver.cancel();
    timer.cancel();
    timer_armed = false;
    reading = false;
    out.clear();
    begin = end = 0;
    auto sent = std::move(replies);
    replies.clear();
    auto notified = std::move(notifications);
    notifications.clear();
    for (auto& command : sent)
      fail(*command, ec, detail);
    for (auto& command : notified)
      fail(*command, ec, detail);
  }

  std::string closed_detail() const {
    return last_close.empty() ? "no connection: call async_connect() first" : "the connection closed: " + last_close;
  }

  void connect(const std::string& host, std::uint16_t port, detail::CompletionPtr<detail::NoResult> completion) {
    if (open.load(std::memory_order_relaxed) || connecting) {
      close_connection(client_error::aborted, "the client connected again");
    }
    connecting = true;
    const auto gen = generation;
    auto shared = std::make_shared<detail::CompletionPtr<detail::NoResult>>(std::move(completion));
    resolver.async_resolve(
        host, std::to_string(port),
        [self = shared_from_this(), gen, shared](std::error_code ec, const tcp::resolver::results_type& results) {
          if (gen != self->generation) ec = asio::error::operation_aborted;
          if (ec) {
            self->connecting = false;
            return complete(*shared, ec, detail::NoResult{});
          }
          asio::async_connect(self->socket, results, [self, gen, shared](std::error_code ec2, const tcp::endpoint&) {
            if (gen != self->generation) ec2 = asio::error::operation_aborted;
            self->connecting = false;
            if (!ec2) {
              self->socket.set_option(tcp::no_delay(true), ec2);
            }
            if (ec2) {
              std::error_code ignored;
              if (gen == self->generation) self->socket.close(ignored);
              return complete(*shared, ec2, detail::NoResult{});
            }
            self->open.store(true, std::memory_order_relaxed);
            self->last_close.clear();
            complete(*shared, {}, detail::NoResult{});
          });
        });
  }

  // ---- sending --------------------------------------------------------------------------------

  /// Queues `arguments` for the connection and `command` for its reply.
  void send(std::unique_ptr<Pending> command, const std::vector<std::string>& arguments,
            std::chrono::milliseconds deadline) {
    command->deadline_length = deadline.count() > 0 ? deadline : options.deadline;
    if (command->deadline_length.count() > 0) {
      command->deadline = Clock::now() + command->deadline_length;
      arm_timer(command->deadline);
    }
    std::vector<std::string_view> views(arguments.begin(), arguments.end());
    resp::encode_command(out, views);
    replies.push_back(std::move(command));
    write_more();
    if (!reading) read_more();
  }

  /// Queues a command whose reply is dropped (ASKING), or handed over to it (a DMA.SET's WAIT),
  /// under the deadline of the command it goes with: a reply that never comes still ends the
  /// connection in time.
  void send_follower(Kind kind, std::uint64_t id, const std::vector<std::string>& arguments,
                     Clock::time_point deadline = Clock::time_point::max()) {
    auto command = std::make_unique<Pending>();
    command->kind = kind;
    command->id = id;
    command->abandoned = true;
    command->deadline = deadline;
    if (deadline != Clock::time_point::max()) {
      command->deadline_length = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      arm_timer(deadline);
    }
    std::vector<std::string_view> views(arguments.begin(), arguments.end());
    resp::encode_command(out, views);
    replies.push_back(std::move(command));
    write_more();
    if (!reading) read_more();
  }

  void write_more() {
    if (writing_now || out.empty()) return;
    writing_now = true;
    std::swap(out, writing);
    asio::async_write(socket, asio::buffer(writing),
                      [self = shared_from_this(), gen = generation](std::error_code ec, std::size_t) {
                        self->writing_now = false;
                        self->writing.clear();
                        if (gen != self->generation) return;
                        if (ec) return self->lost(ec);
                        self->write_more();
                      });
  }

  // ---- receiving ------------------------------------------------------------------------------

  // Reads while replies are due: an idle client keeps no operation outstanding, so an io_context
  // with nothing else to do returns from run(). A server that closed meanwhile is found at the
  // next command.
  void read_more() {
    reading = true;
    if (end == in.size()) make_room(0);
    socket.async_read_some(asio::buffer(in.data() + end, in.size() - end),
                           [self = shared_from_this(), gen = generation](std::error_code ec, std::size_t n) {
                             if (gen != self->generation) return;
                             self->reading = false;
                             if (ec) return self->lost(ec);
                             self->end += n;
                             if (self->take_replies() && !self->replies.empty()) self->read_more();
                           });
  }

  void lost(std::error_code ec) {
    last_close = ec == asio::error::eof ? "the server closed it" : ec.message();
    close_connection(client_error::server_gone, "the connection to the server was lost: " + last_close);
  }

  /// Completes the commands whose replies are in; false once the connection was closed.
  bool take_replies() {
    const auto gen = generation;
    while (begin < end) {
      if (replies.empty()) {
        last_close = "a reply came for no command";
        close_connection(client_error::protocol_error, "the server sent a reply for no command");
        return false;
      }
      const auto parsed = resp::parse_reply(std::string_view(in.data() + begin, end - begin), limits, reply);
      if (parsed.status == resp::Status::error) {
        last_close = "its reply broke RESP: " + parsed.error;
        close_connection(client_error::protocol_error, "the server's reply breaks RESP: " + parsed.error);
        return false;
      }
      if (parsed.status == resp::Status::incomplete) {
        make_room(parsed.needed);
        return true;
      }
      std::unique_ptr<Pending> command = std::move(replies.front());
      replies.pop_front();
      answer(std::move(command), reply);  // views `in`: handled before the bytes are consumed
      if (gen != generation) return false;
      begin += parsed.consumed;
      idle_timer();
    }
    begin = end = 0;
    return true;
  }

  void make_room(std::size_t needed) {
    if (begin > 0) {
      std::memmove(in.data(), in.data() + begin, end - begin);
      end -= begin;
      begin = 0;
    }
    const std::size_t most = limits.max_request + (std::size_t{64} << 10);
    if (needed > in.size()) in.resize(std::min(needed, most));
    if (end == in.size() && in.size() < most) in.resize(std::min(in.size() * 2, most));
  }

  void answer(std::unique_ptr<Pending> command, const resp::Reply& r) {
    if (command->abandoned) return;  // cancelled, or a follower nobody waits for: the reply is dropped
    if (command->kind == Kind::command) return answer_command(*command, r);
    if (r.is_error()) {
      const std::string text(r.text);
      if (command->kind == Kind::hello) {
        fail(*command, client_error::server_error, "DMA.HELLO: " + text);
      } else if (command->kind == Kind::wait) {
        fail(*command, client_error::not_replicated, "DMA.SET: the value is stored, but WAIT failed: " + text);
      } else {
        fail(*command, error_of_reply(text), label(*command) + ": " + text);
      }
      return;
    }
    switch (command->kind) {
      case Kind::hello:
        return answer_hello(*command, r);
      case Kind::set:
        return answer_set(*command, r);
      case Kind::get:
        return answer_get(std::move(command), r);
      case Kind::info:
        return answer_info(*command, r);
      case Kind::wait:
        return answer_wait(*command, r);
      case Kind::command:
      case Kind::asking:
        return;  // answered above, or abandoned
    }
  }

  void answer_command(Pending& command, const resp::Reply& r) {
    CommandResult result;
    result.reply = resp::to_value(r);
    std::error_code ec;
    if (r.is_error()) {
      ec = error_of_reply(r.text);
      result.detail = command.name + ": " + std::string(r.text);
    }
    pending_count.fetch_sub(1, std::memory_order_relaxed);
    complete(std::get<detail::CompletionPtr<CommandResult>>(command.completion), ec, std::move(result));
  }

  void answer_wait(Pending& command, const resp::Reply& r) {
    if (r.type != resp::Reply::Type::integer) {
      return fail(command, client_error::protocol_error,
                  "DMA.SET: the value is stored, but WAIT's reply is no integer");
    }
    SetResult result;
    result.length = command.length;
    result.crc = command.crc;
    result.replicas = r.integer > 0 ? static_cast<std::uint64_t>(r.integer) : 0;
    std::error_code ec;
    if (result.replicas < command.replicas) {
      ec = client_error::not_replicated;
      result.detail = "DMA.SET: the value is stored, but WAIT counted " + std::to_string(result.replicas) + " of " +
                      std::to_string(command.replicas) + " replicas within " +
                      milliseconds_text(command.replica_timeout);
    }
    pending_count.fetch_sub(1, std::memory_order_relaxed);
    complete(std::get<detail::CompletionPtr<SetResult>>(command.completion), ec, std::move(result));
  }

  void answer_hello(Pending& command, const resp::Reply& r) {
    auto read = read_hello_reply(r);
    if (!read.error.empty()) return fail(command, client_error::protocol_error, "DMA.HELLO: " + read.error);
    if (target && target->insert_server) {
      std::error_code ec;
      target->target.insert_initiator(decode_hex(read.reply.server_address_hex), ec);
      if (ec) {
        return fail(command, client_error::protocol_error,
                    "DMA.HELLO: the Target cannot reach the server's fabric address: " + ec.message());
      }
    }
    {
      std::lock_guard lock(hello_mutex);
      hello = read.reply;
    }
    HelloResult result;
    result.reply = std::move(read.reply);
    succeed(command, std::move(result));
  }

  void answer_set(Pending& command, const resp::Reply& r) {
    if (r.type != resp::Reply::Type::simple) {
      return fail(command, client_error::protocol_error, "DMA.SET: the reply is not +OK");
    }
    command.owned.reset();
    if (command.replicas > 0 && !replies.empty() && replies.front()->kind == Kind::wait &&
        replies.front()->id == command.id) {
      // Stored; the WAIT right behind it completes the command.
      Pending& wait = *replies.front();
      wait.completion = std::move(command.completion);
      wait.abandoned = false;
      wait.length = command.length;
      wait.crc = command.crc;
      wait.replicas = command.replicas;
      wait.replica_timeout = command.replica_timeout;
      wait.deadline = command.deadline;
      wait.deadline_length = command.deadline_length;
      return;
    }
    SetResult result;
    result.length = command.length;
    result.crc = command.crc;
    succeed(command, std::move(result));
  }

  void answer_get(std::unique_ptr<Pending> command, const resp::Reply& r) {
    const auto read = read_get_reply(r);
    if (!read.error.empty()) return fail(*command, client_error::protocol_error, "DMA.GET: " + read.error);
    if (read.length > command->into.size()) {
      return fail(*command, client_error::protocol_error,
                  "DMA.GET: the server reports " + std::to_string(read.length) + " bytes for a buffer of " +
                      std::to_string(command->into.size()));
    }
    command->length = read.length;
    command->crc = read.crc;
    if (!command->token || read.length == 0) {  // an empty value is not written, so nothing notifies
      if (command->token) target->forget(*command->token);
      command->token.reset();
      return finish_get(*command);
    }
    // The reply says the server's write completed; the bytes have landed once the Target's
    // notification with the command's token is in.
    Pending* waiting = command.get();
    notifications.push_back(std::move(command));
    const auto token = *waiting->token;
    target->wait(token, [weak = weak_from_this(), id = waiting->id](bool landed) {
      auto self = weak.lock();
      if (!self) return;
      asio::post(self->strand, [self, id, landed] { self->notified(id, landed); });
    });
  }

  void notified(std::uint64_t id, bool landed) {
    const auto it = std::find_if(notifications.begin(), notifications.end(),
                                 [id](const auto& command) { return command->id == id; });
    if (it == notifications.end()) return;  // failed meanwhile
    std::unique_ptr<Pending> command = std::move(*it);
    notifications.erase(it);
    idle_timer();
    command->token.reset();  // settled: nothing to forget
    if (!landed) {
      return fail(*command, client_error::notification_missing,
                  "DMA.GET: the Target dropped notifications while this one was pending (its notification_queue "
                  "was full)");
    }
    finish_get(*command);
  }

  void finish_get(Pending& command) {
    command.owned.reset();  // the server cannot reach the bytes from here on
    const auto bytes = command.into.first(static_cast<std::size_t>(command.length));
    if (options.verify_gets) {
      const auto crc = checksum(bytes);
      if (crc != command.crc) {
        return fail(command, client_error::crc_mismatch,
                    "DMA.GET: the bytes that landed have crc32c " + std::to_string(crc) + ", the server's value " +
                        std::to_string(command.crc));
      }
    }
    GetResult result;
    result.length = command.length;
    result.crc = command.crc;
    succeed(command, std::move(result));
  }

  void answer_info(Pending& command, const resp::Reply& r) {
    if (r.type != resp::Reply::Type::bulk) {
      return fail(command, client_error::protocol_error, "DMA.INFO: the reply is not a bulk string");
    }
    InfoResult result;
    result.text = std::string(r.text);
    succeed(command, std::move(result));
  }

  // ---- deadlines ------------------------------------------------------------------------------

  void arm_timer(Clock::time_point at) {
    if (timer_armed && at >= timer_at) return;
    timer_armed = true;
    timer_at = at;
    timer.expires_at(at);
    timer.async_wait([self = shared_from_this(), gen = generation, at](std::error_code ec) {
      if (ec || gen != self->generation || !self->timer_armed || self->timer_at != at) return;
      self->timer_armed = false;
      self->deadline_passed();
    });
  }

  // ---- cancellation ---------------------------------------------------------------------------

  /// Whether command `id` was cancelled before it reached the strand (and forgets it).
  bool cancelled_before_start(std::uint64_t id) {
    last_started = std::max(last_started, id);
    return cancelled_early.erase(id) > 0;
  }

  void cancel(std::uint64_t id) {
    if (connecting && id == connect_id) {
      last_close = "the connection attempt was cancelled";
      close_connection(asio::error::operation_aborted, "the connection attempt was cancelled");
      return;
    }
    for (auto& command : replies) {
      if (command->id != id || command->abandoned) continue;
      // Completed now; its reply, still due in order, is dropped when it comes.
      fail(*command, asio::error::operation_aborted, label(*command) + ": cancelled; its reply will be dropped");
      command->abandoned = true;
      command->deadline = Clock::time_point::max();
      return;
    }
    const auto it = std::find_if(notifications.begin(), notifications.end(),
                                 [id](const auto& command) { return command->id == id; });
    if (it != notifications.end()) {
      auto command = std::move(*it);
      notifications.erase(it);
      fail(*command, asio::error::operation_aborted, "DMA.GET: cancelled while its notification was due");
      idle_timer();
      return;
    }
    if (id > last_started) cancelled_early.insert(id);  // its start is still on its way to the strand
  }

  // With nothing pending the deadline timer goes too: an idle client keeps no operation outstanding.
  void idle_timer() {
    if (!timer_armed || !notifications.empty()) return;
    for (const auto& command : replies) {
      if (!command->abandoned) return;
    }
    timer_armed = false;
    timer.cancel();
  }

  void deadline_passed() {
    const auto now = Clock::now();
    Pending* late = nullptr;
    Clock::time_point next = Clock::time_point::max();
    for (auto* queue : {&replies, &notifications}) {
      for (auto& command : *queue) {
        if (command->deadline <= now) {
          if (late == nullptr || command->deadline < late->deadline) late = command.get();
        } else {
          next = std::min(next, command->deadline);
        }
      }
    }
    if (late == nullptr) {
      if (next != Clock::time_point::max()) arm_timer(next);
      return;
    }
    const std::string what =
        label(*late) + " took longer than its deadline of " + milliseconds_text(late->deadline_length);
    // Its reply cannot be told apart from the next command's once skipped: the connection goes,
    // and every command on it ends. The late ones time out, the others are aborted.
    for (auto* queue : {&replies, &notifications}) {
      for (auto it = queue->begin(); it != queue->end();) {
        if ((*it)->deadline <= now) {
          auto command = std::move(*it);
          it = queue->erase(it);
          fail(*command, client_error::timed_out,
               label(*command) + " took longer than its deadline of " + milliseconds_text(command->deadline_length) +
                   "; the connection was closed");
        } else {
          ++it;
        }
      }
    }
    last_close = what;
    close_connection(client_error::aborted, "the connection was closed: " + what);
  }

  // ---- state ------------------------------------------------------------------------------

  asio::strand<executor_type> strand;
  std::shared_ptr<ClientTarget::State> target;  ///< null: DMA.INFO only
  ClientOptions options;
  resp::Limits limits;
  tcp::resolver resolver;
  tcp::socket socket;
  asio::steady_timer timer;
  bool timer_armed = false;
  Clock::time_point timer_at;
  std::uint64_t generation = 0;  ///< one per connection: callbacks of a closed one do nothing
  bool connecting = false;
  std::atomic<bool> open{false};
  std::string last_close;
  mutable std::mutex hello_mutex;
  std::optional<HelloReply> hello;
  std::atomic<std::uint64_t> ids{0};  ///< the last command id given out
  std::uint64_t last_started = 0;     ///< the highest id that reached the strand
  std::unordered_set<std::uint64_t> cancelled_early;
  std::uint64_t connect_id = 0;                        ///< the async_connect() in progress
  std::deque<std::unique_ptr<Pending>> replies;        ///< sent, waiting for their replies, in order
  std::deque<std::unique_ptr<Pending>> notifications;  ///< DMA.GETs replied to, waiting for their notification
  std::atomic<std::size_t> pending_count{0};
  std::string out, writing;
  bool writing_now = false;
  bool reading = false;  ///< a read is outstanding on this connection
  std::vector<char> in;
  std::size_t begin = 0, end = 0;
  resp::Reply reply;
};

Client::Client(const executor_type& executor, ClientTarget& target, ClientOptions options)
    : impl_(std::make_shared<Impl>(executor, target.state_, options)) {}

Client::Client(const executor_type& executor, ClientOptions options)
    : impl_(std::make_shared<Impl>(executor, nullptr, options)) {}

Client::~Client() {
  try {
    close();
  } catch (...) {  // no memory to queue the close: the connection ends with its execution context
  }
}

Client::executor_type Client::get_executor() const noexcept { return impl_->strand.get_inner_executor(); }

void Client::close() {
  asio::dispatch(impl_->strand, [impl = impl_] {
    impl->last_close = "close() was called";
    impl->close_connection(client_error::aborted, "the connection was closed: close() was called");
  });
}

bool Client::is_open() const noexcept { return impl_->open.load(std::memory_order_relaxed); }

std::optional<HelloReply> Client::hello() const {
  std::lock_guard lock(impl_->hello_mutex);
  return impl_->hello;
}

std::size_t Client::pending() const noexcept { return impl_->pending_count.load(std::memory_order_relaxed); }

std::uint64_t Client::next_command_id() noexcept { return impl_->ids.fetch_add(1, std::memory_order_relaxed) + 1; }

void Client::cancel(const std::weak_ptr<Impl>& weak, std::uint64_t id) {
  auto impl = weak.lock();
  if (!impl) return;
  asio::dispatch(impl->strand, [impl, id] { impl->cancel(id); });
}

void Client::start_connect(const std::string& host, std::uint16_t port, std::uint64_t id,
                           detail::CompletionPtr<detail::NoResult> completion) {
  asio::dispatch(impl_->strand, [impl = impl_, host, port, id, c = std::move(completion)]() mutable {
    if (impl->cancelled_before_start(id)) return Impl::complete(c, asio::error::operation_aborted, detail::NoResult{});
    impl->connect(host, port, std::move(c));
    impl->connect_id = id;
  });
}

void Client::start_hello(std::uint64_t id, detail::CompletionPtr<HelloResult> completion) {
  impl_->pending_count.fetch_add(1, std::memory_order_relaxed);
  asio::dispatch(impl_->strand, [impl = impl_, id, c = std::move(completion)]() mutable {
    if (impl->cancelled_before_start(id)) {
      return impl->fail_now(std::move(c), asio::error::operation_aborted, "DMA.HELLO: cancelled before it was sent");
    }
    if (!impl->target) {
      return impl->fail_now(std::move(c), client_error::invalid_argument,
                            "DMA.HELLO: this client has no ClientTarget to advertise");
    }
    if (!impl->open.load(std::memory_order_relaxed)) {
      return impl->fail_now(std::move(c), client_error::not_connected, "DMA.HELLO: " + impl->closed_detail());
    }
    auto command = std::make_unique<Pending>();
    command->kind = Kind::hello;
    command->id = id;
    command->completion = std::move(c);
    impl->send(std::move(command), hello_arguments(impl->target->target.local_address()), {});
  });
}

// A DMA.SET's or DMA.GET's start on the strand: the HELLO it names, and where its bytes lie for the
// server (inside the caller's region, or exposed for the command alone into `command.owned`).
std::optional<Refusal> Client::Impl::prepare(Pending& command, std::span<std::byte> bytes, const Target::Region* region,
                                             Target::Access access, HelloReply& named, Window& window) {
  const std::string name = label(command);
  if (!open.load(std::memory_order_relaxed)) {
    return Refusal{client_error::not_connected, name + ": " + closed_detail()};
  }
  {
    std::lock_guard lock(hello_mutex);
    if (!hello) return Refusal{client_error::no_hello, name + ": send DMA.HELLO first (async_hello)"};
    named = *hello;
  }
  window = Window{0, 0, bytes.size()};
  if (bytes.empty()) return std::nullopt;
  if (region != nullptr) {
    if (auto why = window_in(*region, bytes, window); !why.empty()) {
      return Refusal{client_error::invalid_argument, name + ": " + why};
    }
    return std::nullopt;
  }
  std::error_code ec;
  auto exposed = target->target.expose(bytes, access, ec);
  if (ec) {
    return Refusal{client_error::registration_failed,
                   name + ": exposing " + std::to_string(bytes.size()) + " bytes: " + ec.message()};
  }
  command.owned.emplace(std::move(exposed));
  (void)window_in(*command.owned, bytes, window);
  return std::nullopt;
}

void Client::start_set(const std::string& key, const SetRequest& request, std::uint64_t id,
                       detail::CompletionPtr<SetResult> completion) {
  impl_->pending_count.fetch_add(1, std::memory_order_relaxed);
  asio::dispatch(impl_->strand, [impl = impl_, key, request, id, c = std::move(completion)]() mutable {
    if (impl->cancelled_before_start(id)) {
      return impl->fail_now(std::move(c), asio::error::operation_aborted, "DMA.SET: cancelled before it was sent");
    }
    auto command = std::make_unique<Pending>();
    command->kind = Kind::set;
    command->id = id;
    HelloReply hello;
    Window window;
    // Read access only: the server may read these bytes, never write them.
    const std::span<std::byte> bytes(const_cast<std::byte*>(request.value.data()), request.value.size());
    if (auto refused = impl->prepare(*command, bytes, request.region, Target::Access::read, hello, window)) {
      return impl->fail_now(std::move(c), refused->error, std::move(refused->detail));
    }
    std::optional<std::uint32_t> crc;
    if (impl->options.checksum_sets) crc = checksum(request.value);
    command->length = request.value.size();
    command->crc = crc.value_or(0);
    command->completion = std::move(c);
    command->replicas = request.replicas;
    command->replica_timeout = request.replica_timeout;
    if (request.asking) impl->send_follower(Kind::asking, id, {"ASKING"});
    const auto length = request.deadline.count() > 0 ? request.deadline : impl->options.deadline;
    const auto deadline = length.count() > 0 ? Clock::now() + length : Clock::time_point::max();
    impl->send(std::move(command), set_arguments(key, window, crc, hello.token), request.deadline);
    if (request.replicas > 0) {
      // WAIT's timeout of zero waits for ever: the command's deadline bounds it instead.
      const auto wait_ms = request.replica_timeout.count() > 0 ? request.replica_timeout : length;
      impl->send_follower(Kind::wait, id, {"WAIT", std::to_string(request.replicas), std::to_string(wait_ms.count())},
                          deadline);
    }
  });
}

void Client::start_get(const std::string& key, const GetRequest& request, std::uint64_t id,
                       detail::CompletionPtr<GetResult> completion) {
  impl_->pending_count.fetch_add(1, std::memory_order_relaxed);
  asio::dispatch(impl_->strand, [impl = impl_, key, request, id, c = std::move(completion)]() mutable {
    if (impl->cancelled_before_start(id)) {
      return impl->fail_now(std::move(c), asio::error::operation_aborted, "DMA.GET: cancelled before it was sent");
    }
    auto command = std::make_unique<Pending>();
    command->kind = Kind::get;
    command->id = id;
    command->into = request.into;
    HelloReply hello;
    Window window;
    if (auto refused = impl->prepare(*command, request.into, request.region, Target::Access::write, hello, window)) {
      return impl->fail_now(std::move(c), refused->error, std::move(refused->detail));
    }
    if (hello.confirmation == Confirmation::notification) command->token = impl->target->issue();
    command->completion = std::move(c);
    const auto arguments = get_arguments(key, window, command->token, hello.token);
    if (request.asking) impl->send_follower(Kind::asking, id, {"ASKING"});
    impl->send(std::move(command), arguments, request.deadline);
  });
}

void Client::start_info(std::uint64_t id, detail::CompletionPtr<InfoResult> completion) {
  impl_->pending_count.fetch_add(1, std::memory_order_relaxed);
  asio::dispatch(impl_->strand, [impl = impl_, id, c = std::move(completion)]() mutable {
    if (impl->cancelled_before_start(id)) {
      return impl->fail_now(std::move(c), asio::error::operation_aborted, "DMA.INFO: cancelled before it was sent");
    }
    if (!impl->open.load(std::memory_order_relaxed)) {
      return impl->fail_now(std::move(c), client_error::not_connected, "DMA.INFO: " + impl->closed_detail());
    }
    auto command = std::make_unique<Pending>();
    command->kind = Kind::info;
    command->id = id;
    command->completion = std::move(c);
    impl->send(std::move(command), {std::string(info_command.name)}, {});
  });
}

void Client::start_command(std::vector<std::string>&& arguments, std::uint64_t id,
                           detail::CompletionPtr<CommandResult> completion) {
  impl_->pending_count.fetch_add(1, std::memory_order_relaxed);
  asio::dispatch(
      impl_->strand, [impl = impl_, arguments = std::move(arguments), id, c = std::move(completion)]() mutable {
        const std::string name = arguments.empty() ? std::string("command") : arguments.front();
        if (impl->cancelled_before_start(id)) {
          return impl->fail_now(std::move(c), asio::error::operation_aborted, name + ": cancelled before it was sent");
        }
        if (arguments.empty())
          return impl->fail_now(std::move(c), client_error::invalid_argument, "the command is empty");
        // Commands after which replies stop matching commands one for one.
        for (const std::string_view pushed : {"SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "MONITOR", "SYNC", "PSYNC"}) {
          if (resp::iequals(name, pushed)) {
            return impl->fail_now(std::move(c), client_error::invalid_argument,
                                  name + ": its replies do not come one per command; use a connection of its own");
          }
        }
        if (!impl->open.load(std::memory_order_relaxed)) {
          return impl->fail_now(std::move(c), client_error::not_connected, name + ": " + impl->closed_detail());
        }
        auto command = std::make_unique<Pending>();
        command->kind = Kind::command;
        command->id = id;
        command->name = name;
        command->completion = std::move(c);
        impl->send(std::move(command), arguments, {});
      });
}

}  // namespace dma::kv
