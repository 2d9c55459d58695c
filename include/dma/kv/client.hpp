/// @file
/// dma::kv::Client: the client half of the side channel (docs/side-channel.md) as an Asio I/O
/// object. It owns one RESP connection to one server (dma-kv-server, or redis-server / Valkey with
/// the dma module), sends `DMA.HELLO`, `DMA.SET`, `DMA.GET` and `DMA.INFO` on it, pipelined, and
/// completes each command once its reply (and, where the server asks for one, its Target
/// notification) is in. The bytes move between the server and memory the application's Target
/// exposes; the client's thread never touches them except for the CRC-32C.
///
/// The model: one Client is one connection, and its commands are answered in the order they were
/// sent. For concurrency, open several Clients on one ClientTarget: they share its Target (one
/// fabric address, one progress thread) and its notifications. Every member function may be
/// called from any thread; handlers run on their associated executor (by default the Client's).
///
/// The callback form, for code without Asio, is dma::kv::CallbackClient (callback_client.hpp).
#pragma once

#include <dma/detail/block_pool.hpp>
#include <dma/detail/handler.hpp>
#include <dma/export.hpp>
#include <dma/kv/protocol.hpp>
#include <dma/kv/resp.hpp>
#include <dma/target.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/execution_context.hpp>
#include <asio/prefer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace dma::kv {

/// What went wrong with a command, as a Client's handler receives it. Every result also carries
/// `detail`: the server's error text, or what the client saw, in words.
enum class client_error {
  not_connected = 1,     ///< no connection: async_connect() first, or it closed
  server_gone,           ///< the server closed the connection, or it broke
  protocol_error,        ///< a reply that is not RESP, or not the command's shape
  no_hello,              ///< `-NOHELLO`, or a data command before async_hello()
  transfer_failed,       ///< the server's transfer to or from the client's memory failed
  crc_mismatch,          ///< DMA.SET: the server read other bytes; DMA.GET: the bytes differ from the server's CRC
  no_such_key,           ///< DMA.GET of a key that holds nothing
  buffer_too_small,      ///< DMA.GET into a buffer smaller than the value
  value_too_large,       ///< DMA.SET of a value over the server's limit
  try_again,             ///< `-TRYAGAIN`: nothing was stored; send the command again
  cluster_down,          ///< `-CLUSTERDOWN`
  out_of_memory,         ///< `-OOM`
  wrong_type,            ///< `-WRONGTYPE`: the key holds something else than a value
  redirected,            ///< `-MOVED` or `-ASK`: the key lives on another node
  server_error,          ///< any other error reply
  timed_out,             ///< the command's deadline passed; the connection was closed
  aborted,               ///< the connection closed under the command (close(), another command's deadline)
  notification_missing,  ///< DMA.GET: the Target's notification did not come, or the Target dropped it
  invalid_argument,      ///< the request itself: bytes outside the region, an empty key, a value too large to send
  registration_failed,   ///< exposing the command's own bytes on the Target failed
  not_replicated,  ///< DMA.SET stored the value, but fewer replicas than SetRequest::replicas acknowledged it in time
};

/// The category of client_error ("dma.kv.client").
DMA_EXPORT const std::error_category& client_category() noexcept;
/// A client_error as a std::error_code.
inline std::error_code make_error_code(client_error e) noexcept { return {static_cast<int>(e), client_category()}; }

/// The client_error for an error reply's text (its first word, and the protocol's error texts).
DMA_EXPORT client_error error_of_reply(std::string_view text) noexcept;

/// How a Client behaves.
struct ClientOptions {
  /// How long a command may take from its call to its completion, the Target's notification of a
  /// DMA.GET included; zero: no deadline. When one passes, the command fails with
  /// client_error::timed_out and the connection is closed (a RESP reply cannot be skipped
  /// reliably otherwise), failing the commands behind it with client_error::aborted.
  std::chrono::milliseconds deadline{std::chrono::seconds(30)};
  /// DMA.SET sends the value's CRC-32C, so the server stores only the bytes the client meant.
  bool checksum_sets = true;
  /// DMA.GET checks the bytes that landed against the CRC-32C the server replied with.
  bool verify_gets = true;
  /// The largest reply the client reads (DMA.INFO's text), bytes.
  std::size_t max_reply = std::size_t{1} << 20;
};

/// DMA.SET: the value, where it lies, and how long the command may take.
struct SetRequest {
  std::string_view key;                    ///< the key (copied when the command starts)
  std::span<const std::byte> value;        ///< the value; kept alive and unchanged until completion
  const Target::Region* region = nullptr;  ///< an exposed region holding `value`, or null: exposed for this command
  std::chrono::milliseconds deadline{0};   ///< zero: ClientOptions::deadline
  /// Durability: when not zero, `WAIT replicas replica_timeout` follows the DMA.SET on the same
  /// connection, and the command succeeds only if that many replicas acknowledged the write in
  /// time (else client_error::not_replicated: the value is on the server, not yet on them).
  unsigned replicas = 0;
  std::chrono::milliseconds replica_timeout{1000};  ///< WAIT's timeout; zero waits for ever (bounded by `deadline`)
  bool asking = false;                              ///< send `ASKING` first (a cluster's `-ASK` redirect)
};

/// DMA.GET: where the value lands, and how long the command may take.
struct GetRequest {
  std::string_view key;                    ///< the key (copied when the command starts)
  std::span<std::byte> into;               ///< its capacity bounds the value; kept alive until completion
  const Target::Region* region = nullptr;  ///< an exposed region holding `into`, or null: exposed for this command
  std::chrono::milliseconds deadline{0};   ///< zero: ClientOptions::deadline
  bool asking = false;                     ///< send `ASKING` first (a cluster's `-ASK` redirect)
};

/// What DMA.HELLO answered.
struct HelloResult {
  HelloReply reply;    ///< the server's fabric address, the client's id and token, the limits
  std::string detail;  ///< when the handler's error is set: what happened
};

/// What DMA.SET did.
struct SetResult {
  std::uint64_t length = 0;    ///< bytes stored
  std::uint32_t crc = 0;       ///< their CRC-32C (0 when ClientOptions::checksum_sets is off)
  std::uint64_t replicas = 0;  ///< with SetRequest::replicas: how many replicas WAIT counted
  std::string detail;          ///< when the handler's error is set: what happened
};

/// What DMA.GET did.
struct GetResult {
  std::uint64_t length = 0;  ///< bytes of the value, at the start of GetRequest::into
  std::uint32_t crc = 0;     ///< the CRC-32C the server keeps for them
  std::string detail;        ///< when the handler's error is set: what happened
};

/// What any other command answered (async_command).
struct CommandResult {
  resp::Value reply;   ///< the reply, an error reply included
  std::string detail;  ///< when the handler's error is set: what happened
};

/// What DMA.INFO answered.
struct InfoResult {
  std::string text;    ///< `# Section` headers and `field:value` lines
  std::string detail;  ///< when the handler's error is set: what happened
};

/// A Target as the side channel's clients share it: the Target exposes their buffers, and this
/// routes its write notifications to the DMA.GETs that wait for them (servers that confirm a
/// DMA.GET by notification, as on efa-direct, write the client's token as immediate data). It
/// takes the Target's notification callback while it lives. Thread-safe.
class DMA_EXPORT ClientTarget {
 public:
  /// Routes target's notifications; the Target must outlive this and every Client on it.
  explicit ClientTarget(Target& target);
  /// Gives the Target's notification callback back.
  ~ClientTarget();
  ClientTarget(const ClientTarget&) = delete;
  ClientTarget& operator=(const ClientTarget&) = delete;

  /// The Target.
  Target& target() const noexcept;
  /// Notifications that named no pending DMA.GET (one that failed or timed out, say).
  std::uint64_t strays() const noexcept;

  /// The routing state, shared with the Clients' pending DMA.GETs.
  struct State;

 private:
  friend class Client;
  std::shared_ptr<State> state_;
};

namespace detail {

/// No result beside the error (async_connect).
struct NoResult {};

/// A pending command's handler, its type erased.
template <typename Result>
struct Completion {
  /// Frees the completion, then posts its handler with (ec[, result]) to its executor.
  void (*complete)(Completion* self, std::error_code ec, Result&& result) = nullptr;
  /// Frees the completion without running its handler.
  void (*destroy)(Completion* self) noexcept = nullptr;
};

template <typename Result>
struct CompletionDeleter {
  void operator()(Completion<Result>* c) const noexcept { c->destroy(c); }
};
/// Owns a Completion; destroying it without complete() drops the handler unrun.
template <typename Result>
using CompletionPtr = std::unique_ptr<Completion<Result>, CompletionDeleter<Result>>;

/// Runs `completion` and releases it.
template <typename Result>
void finish(CompletionPtr<Result> completion, std::error_code ec, std::type_identity_t<Result>&& result) {
  Completion<Result>* c = completion.release();
  c->complete(c, ec, std::move(result));
}

/// The completion of one handler, allocated with the handler's associated allocator.
template <typename Result, typename Handler, typename IoExecutor>
struct CompletionFor final : Completion<Result> {
  using HandlerExecutor = asio::associated_executor_t<Handler, IoExecutor>;
  using WorkExecutor = std::decay_t<decltype(asio::prefer(std::declval<const HandlerExecutor&>(),
                                                          asio::execution::outstanding_work.tracked))>;
  using Allocator = typename std::allocator_traits<
      asio::associated_allocator_t<Handler, dma::detail::PoolAllocator<void>>>::template rebind_alloc<CompletionFor>;

  CompletionFor(Handler&& h, const IoExecutor& io_executor)
      : handler(std::move(h)),
        work(asio::prefer(asio::get_associated_executor(handler, io_executor),
                          asio::execution::outstanding_work.tracked)) {
    this->complete = &run;
    this->destroy = &free;
  }

  static CompletionPtr<Result> create(Handler&& handler, const IoExecutor& io_executor) {
    Allocator allocator(asio::get_associated_allocator(handler, dma::detail::PoolAllocator<void>()));
    CompletionFor* c = std::allocator_traits<Allocator>::allocate(allocator, 1);
    try {
      std::allocator_traits<Allocator>::construct(allocator, c, std::move(handler), io_executor);
    } catch (...) {
      std::allocator_traits<Allocator>::deallocate(allocator, c, 1);
      throw;
    }
    return CompletionPtr<Result>(c);
  }

  static void free(Completion<Result>* base) noexcept {
    auto* c = static_cast<CompletionFor*>(base);
    Allocator allocator(asio::get_associated_allocator(c->handler, dma::detail::PoolAllocator<void>()));
    std::allocator_traits<Allocator>::destroy(allocator, c);
    std::allocator_traits<Allocator>::deallocate(allocator, c, 1);
  }

  static void run(Completion<Result>* base, std::error_code ec, Result&& result) {
    auto* c = static_cast<CompletionFor*>(base);
    auto slot = asio::get_associated_cancellation_slot(c->handler);
    if (slot.is_connected()) slot.clear();
    Handler handler(std::move(c->handler));
    WorkExecutor executor(std::move(c->work));
    free(c);
    // Posted: a handler never runs inside the client's own work, so it may call the client (or
    // destroy it) freely.
    if constexpr (std::is_same_v<Result, NoResult>) {
      dma::detail::post_with_allocator(std::move(executor), std::move(handler), ec);
    } else {
      dma::detail::post_with_allocator(std::move(executor), std::move(handler), ec, std::move(result));
    }
  }

  Handler handler;
  WorkExecutor work;
};

}  // namespace detail

/// One RESP connection to one side-channel server, whose DMA.SETs and DMA.GETs move bytes
/// between the server and buffers a ClientTarget's Target exposes. Commands are pipelined: each
/// is written at once and completes when its reply has come, in the order they were sent.
///
/// A command's buffer is either inside a Region the application exposed once (the region
/// overloads: no registration per command), or exposed by the client for that command alone and
/// closed before it completes (the span overloads: one registration per command, whose cost
/// grows with the provider's; nothing of it outlives the command).
///
/// Per-operation cancellation (terminal, partial and total alike) completes the command at once
/// with asio::error::operation_aborted and leaves the connection as it is: the command's reply is
/// read and dropped when it comes. A cancelled async_connect() closes the attempt.
///
/// After a deadline, a cancellation, close(), or a lost connection, a transfer the server had
/// started may still reach a caller's Region until the server's own transfer deadline
/// (dma-kv-server's `--transfer-deadline-ms`); the span overloads' bytes are safe at completion,
/// since their registration is closed by then.
class DMA_EXPORT Client {
 public:
  /// The executor the client's work and, by default, its handlers run on.
  using executor_type = asio::any_io_executor;
  /// The token the initiating functions use when the caller names none: asio::use_awaitable_t<>.
  using default_token_type = dma::detail::default_token_t<executor_type>;

  /// A client without a connection, whose buffers `target` exposes.
  Client(const executor_type& executor, ClientTarget& target, ClientOptions options = {});
  /// A client without a Target: it sends DMA.INFO; DMA.HELLO fails with
  /// client_error::invalid_argument.
  explicit Client(const executor_type& executor, ClientOptions options = {});
  /// As Client(context.get_executor(), target, options).
  template <typename ExecutionContext>
  requires std::is_convertible_v<ExecutionContext&, asio::execution_context&> Client(ExecutionContext& context,
                                                                                     ClientTarget& target,
                                                                                     ClientOptions options = {})
      : Client(executor_type(context.get_executor()), target, options) {}
  /// Closes the connection; pending commands complete with client_error::aborted.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// The executor.
  executor_type get_executor() const noexcept;

  /// Connects to `host` (a name or an address) at `port`, TCP with no delay. A client that was
  /// connected closes first (its pending commands complete with client_error::aborted) and must
  /// send DMA.HELLO again.
  /// @par Completion Signature
  /// @code void(std::error_code) @endcode
  template <asio::completion_token_for<void(std::error_code)> CompletionToken = default_token_type>
  auto async_connect(std::string host, std::uint16_t port, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code)>(
        [this](auto handler, const std::string& h, std::uint16_t p) {
          const auto id = next_command_id();
          start_connect(h, p, id, wrap<detail::NoResult>(std::move(handler), id));
        },
        token, std::move(host), port);
  }

  /// Sends DMA.HELLO with the Target's fabric address; on success the client's data commands name
  /// the token the server returns (`CLIENT <token>`), and on efa the Target learns the server's
  /// address. Fails with the server's error (client_error::server_error: an address it refuses).
  /// @par Completion Signature
  /// @code void(std::error_code, dma::kv::HelloResult) @endcode
  template <asio::completion_token_for<void(std::error_code, HelloResult)> CompletionToken = default_token_type>
  auto async_hello(CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code, HelloResult)>(
        [this](auto handler) {
          const auto id = next_command_id();
          start_hello(id, wrap<HelloResult>(std::move(handler), id));
        },
        token);
  }

  /// DMA.SET of `value` under `key`: the server reads the bytes from the client's memory and
  /// stores them. The bytes must stay unchanged until the handler runs.
  /// @par Completion Signature
  /// @code void(std::error_code, dma::kv::SetResult) @endcode
  template <asio::completion_token_for<void(std::error_code, SetResult)> CompletionToken = default_token_type>
  auto async_set(const SetRequest& request, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code, SetResult)>(
        [this](auto handler, const std::string& key, const SetRequest& r) {
          const auto id = next_command_id();
          start_set(key, r, id, wrap<SetResult>(std::move(handler), id));
        },
        token, std::string(request.key), request);
  }
  /// DMA.SET of `value`, exposed for this command alone.
  template <asio::completion_token_for<void(std::error_code, SetResult)> CompletionToken = default_token_type>
  auto async_set(std::string_view key, std::span<const std::byte> value,
                 CompletionToken&& token = default_token_type()) {
    return async_set(SetRequest{key, value, nullptr, {}}, std::forward<CompletionToken>(token));
  }
  /// DMA.SET of `value`, which lies inside `region`.
  template <asio::completion_token_for<void(std::error_code, SetResult)> CompletionToken = default_token_type>
  auto async_set(std::string_view key, const Target::Region& region, std::span<const std::byte> value,
                 CompletionToken&& token = default_token_type()) {
    return async_set(SetRequest{key, value, &region, {}}, std::forward<CompletionToken>(token));
  }

  /// DMA.GET of `key` into `into`: the server writes the value into the client's memory; the
  /// handler runs once the bytes are there (after the Target's notification where the server
  /// confirms by one), checked against the server's CRC-32C (ClientOptions::verify_gets).
  /// @par Completion Signature
  /// @code void(std::error_code, dma::kv::GetResult) @endcode
  template <asio::completion_token_for<void(std::error_code, GetResult)> CompletionToken = default_token_type>
  auto async_get(const GetRequest& request, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code, GetResult)>(
        [this](auto handler, const std::string& key, const GetRequest& r) {
          const auto id = next_command_id();
          start_get(key, r, id, wrap<GetResult>(std::move(handler), id));
        },
        token, std::string(request.key), request);
  }
  /// DMA.GET into `into`, exposed for this command alone.
  template <asio::completion_token_for<void(std::error_code, GetResult)> CompletionToken = default_token_type>
  auto async_get(std::string_view key, std::span<std::byte> into, CompletionToken&& token = default_token_type()) {
    return async_get(GetRequest{key, into, nullptr, {}}, std::forward<CompletionToken>(token));
  }
  /// DMA.GET into `into`, which lies inside `region`.
  template <asio::completion_token_for<void(std::error_code, GetResult)> CompletionToken = default_token_type>
  auto async_get(std::string_view key, const Target::Region& region, std::span<std::byte> into,
                 CompletionToken&& token = default_token_type()) {
    return async_get(GetRequest{key, into, &region, {}}, std::forward<CompletionToken>(token));
  }

  /// DMA.INFO: the server's side-channel state and counters.
  /// @par Completion Signature
  /// @code void(std::error_code, dma::kv::InfoResult) @endcode
  template <asio::completion_token_for<void(std::error_code, InfoResult)> CompletionToken = default_token_type>
  auto async_info(CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code, InfoResult)>(
        [this](auto handler) {
          const auto id = next_command_id();
          start_info(id, wrap<InfoResult>(std::move(handler), id));
        },
        token);
  }

  /// Any other command (`CLUSTER SHARDS`, `READONLY`, `WAIT`, `PING`, …), pipelined with the
  /// rest. An error reply fails it with error_of_reply() of its text, and `reply` holds it.
  /// @par Completion Signature
  /// @code void(std::error_code, dma::kv::CommandResult) @endcode
  template <asio::completion_token_for<void(std::error_code, CommandResult)> CompletionToken = default_token_type>
  auto async_command(std::vector<std::string> arguments, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code, CommandResult)>(
        [this](auto handler, std::vector<std::string>&& a) {
          const auto id = next_command_id();
          start_command(std::move(a), id, wrap<CommandResult>(std::move(handler), id));
        },
        token, std::move(arguments));
  }

  /// Closes the connection; pending commands complete with client_error::aborted.
  void close();
  /// True from a successful async_connect() until the connection closes.
  bool is_open() const noexcept;
  /// What the server's DMA.HELLO answered, once it has.
  std::optional<HelloReply> hello() const;
  /// Commands started (async_hello, async_set, async_get, async_info, async_command) and not yet
  /// completed.
  std::size_t pending() const noexcept;

 private:
  struct Impl;

  // A command's per-operation cancellation: it reaches the command through the client's strand.
  struct Canceller {
    Canceller(std::weak_ptr<Impl> i, std::uint64_t c) noexcept : impl(std::move(i)), id(c) {}
    std::weak_ptr<Impl> impl;
    std::uint64_t id;
    void operator()(asio::cancellation_type type) const {
      if (type != asio::cancellation_type::none) cancel(impl, id);
    }
  };

  template <typename Result, typename Handler>
  detail::CompletionPtr<Result> wrap(Handler&& handler, std::uint64_t id) {
    using For = detail::CompletionFor<Result, std::decay_t<Handler>, executor_type>;
    auto completion = For::create(std::forward<Handler>(handler), get_executor());
    auto slot = asio::get_associated_cancellation_slot(static_cast<For&>(*completion).handler);
    if (slot.is_connected()) slot.template emplace<Canceller>(std::weak_ptr<Impl>(impl_), id);
    return completion;
  }

  std::uint64_t next_command_id() noexcept;
  static void cancel(const std::weak_ptr<Impl>& impl, std::uint64_t id);
  void start_connect(const std::string& host, std::uint16_t port, std::uint64_t id,
                     detail::CompletionPtr<detail::NoResult> completion);
  void start_hello(std::uint64_t id, detail::CompletionPtr<HelloResult> completion);
  void start_set(const std::string& key, const SetRequest& request, std::uint64_t id,
                 detail::CompletionPtr<SetResult> completion);
  void start_get(const std::string& key, const GetRequest& request, std::uint64_t id,
                 detail::CompletionPtr<GetResult> completion);
  void start_info(std::uint64_t id, detail::CompletionPtr<InfoResult> completion);
  void start_command(std::vector<std::string>&& arguments, std::uint64_t id,
                     detail::CompletionPtr<CommandResult> completion);

  std::shared_ptr<Impl> impl_;
};

}  // namespace dma::kv

template <>
struct std::is_error_code_enum<dma::kv::client_error> : std::true_type {};
