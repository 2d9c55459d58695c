/// @file
/// dma::kv::ClusterClient: the side channel's client for a Redis or Valkey Cluster whose nodes run
/// the dma module. Given any node, it learns the slot map (`CLUSTER SHARDS`, or `CLUSTER SLOTS`
/// on servers without it), opens one dma::kv::Client per node it uses, with a DMA.HELLO on each,
/// and sends every DMA.SET and DMA.GET to the node serving its key's slot. It follows `-MOVED`
/// (and refreshes its map) and `-ASK` (with `ASKING`), retries `-TRYAGAIN`, `-CLUSTERDOWN`,
/// `-NOHELLO`, what a node answers while its role changes (`-UNBLOCKED`, `-LOADING`,
/// `-MASTERDOWN`) and lost nodes with a bounded back-off until the command's deadline, reads from
/// replicas when asked, and waits for replicas (`WAIT`) per DMA.SET when asked.
///
/// Every member function may be called from any thread; handlers run on their associated
/// executor (by default the ClusterClient's). docs/cluster.md describes what each failure looks
/// like to it.
#pragma once

#include <dma/export.hpp>
#include <dma/kv/client.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/execution_context.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace dma::kv {

/// How a ClusterClient behaves.
struct ClusterOptions {
  /// Each node's connection. Its `deadline` bounds a whole command here, redirects and retries
  /// included; each attempt gets what is left of it.
  ClientOptions client;
  /// `-MOVED` and `-ASK` redirects one command follows at most.
  unsigned max_redirects = 16;
  /// Attempts one command makes at most (redirects, retries and the first one).
  unsigned max_attempts = 200;
  /// The first wait after `-TRYAGAIN`, `-CLUSTERDOWN`, `-UNBLOCKED`, `-LOADING`, `-MASTERDOWN` or a
  /// lost node; each further one doubles, up to `retry_most`.
  std::chrono::milliseconds retry_first{10};
  std::chrono::milliseconds retry_most{500};
  /// DMA.GETs go to a replica of their slot (each node connection sends `READONLY`), or to its
  /// primary when it has none or the replica cannot be reached. A replica serves what it has
  /// received: a value stored without SetRequest::replicas may not be there yet.
  bool read_from_replicas = false;
  /// A node connection (TCP, DMA.HELLO, READONLY) that takes longer is given up, and so is the
  /// node for that attempt.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(5)};
  /// A command that starts this long after the last reading of the slot map has it read again,
  /// in the background (replicas that came online, nodes added); zero: only on redirects and
  /// failures. Servers list a replica only once it has replicated something.
  std::chrono::milliseconds map_age{std::chrono::seconds(5)};
};

/// What a ClusterClient has done, summed since it was made.
struct ClusterStats {
  std::uint64_t moved = 0;          ///< `-MOVED` redirects followed
  std::uint64_t asked = 0;          ///< `-ASK` redirects followed (with `ASKING`)
  std::uint64_t retries = 0;        ///< waits before another attempt (`-TRYAGAIN`, a lost node, …)
  std::uint64_t refreshes = 0;      ///< slot maps read from a node
  std::uint64_t connections = 0;    ///< node connections opened (each with its DMA.HELLO)
  std::uint64_t replica_reads = 0;  ///< DMA.GETs a replica answered
};

/// A cluster's side channel: DMA.SET and DMA.GET routed by their key's slot, with their bytes in
/// memory a ClientTarget's Target exposes (the same Region serves every node).
///
/// A command completes once, with the outcome of its last attempt: success, or the error that
/// ended it (a final one such as client_error::no_such_key, or the last retryable one when the
/// deadline or ClusterOptions::max_attempts ran out; `detail` then says how many attempts were
/// made). A DMA.SET that failed after its bytes may have been stored (a node lost mid-command) is
/// sent again, whole: the same key with the same bytes, so a repeat stores the same value.
///
/// Per-operation cancellation (terminal) completes the command with asio::error::operation_aborted.
/// As with Client, a transfer the server had started may still reach the caller's Region after a
/// cancellation, a deadline or close(), until the server's own transfer deadline.
class DMA_EXPORT ClusterClient {
 public:
  /// The executor the client's work and, by default, its handlers run on.
  using executor_type = asio::any_io_executor;
  /// The token the initiating functions use when the caller names none: asio::use_awaitable_t<>.
  using default_token_type = dma::detail::default_token_t<executor_type>;

  /// A client that knows no cluster yet, whose buffers `target` exposes.
  ClusterClient(const executor_type& executor, ClientTarget& target, ClusterOptions options = {});
  /// As ClusterClient(context.get_executor(), target, options).
  template <typename ExecutionContext>
  requires std::is_convertible_v<ExecutionContext&, asio::execution_context&> ClusterClient(ExecutionContext& context,
                                                                                            ClientTarget& target,
                                                                                            ClusterOptions options = {})
      : ClusterClient(executor_type(context.get_executor()), target, options) {}
  /// Closes every node connection; pending commands complete with client_error::aborted.
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  /// The executor.
  executor_type get_executor() const noexcept;

  /// Reads the slot map from the node at `host`:`port` (any node of the cluster, primary or
  /// replica, whatever slots it serves), which the client also keeps as a seed to read it again
  /// from. Node connections open when a command first needs them.
  /// @par Completion Signature
  /// @code void(std::error_code) @endcode
  template <asio::completion_token_for<void(std::error_code)> CompletionToken = default_token_type>
  auto async_connect(std::string host, std::uint16_t port, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code)>(
        [this](auto handler, std::string&& h, std::uint16_t p) {
          auto slot = asio::get_associated_cancellation_slot(handler);
          start_connect(std::move(h), p, wrap<detail::NoResult>(std::move(handler)), slot);
        },
        token, std::move(host), port);
  }

  /// DMA.SET on the node serving the key's slot (SetRequest as for Client; `asking` is the
  /// client's own and ignored).
  /// @par Completion Signature
  /// @code void(std::error_code, dma::kv::SetResult) @endcode
  template <asio::completion_token_for<void(std::error_code, SetResult)> CompletionToken = default_token_type>
  auto async_set(const SetRequest& request, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code, SetResult)>(
        [this](auto handler, std::string&& key, const SetRequest& r) {
          auto slot = asio::get_associated_cancellation_slot(handler);
          start_set(std::move(key), r, wrap<SetResult>(std::move(handler)), slot);
        },
        token, std::string(request.key), request);
  }
  /// DMA.SET of `value`, which lies inside `region`.
  template <asio::completion_token_for<void(std::error_code, SetResult)> CompletionToken = default_token_type>
  auto async_set(std::string_view key, const Target::Region& region, std::span<const std::byte> value,
                 CompletionToken&& token = default_token_type()) {
    return async_set(SetRequest{key, value, &region, {}}, std::forward<CompletionToken>(token));
  }

  /// DMA.GET from the node serving the key's slot (a replica of it with
  /// ClusterOptions::read_from_replicas).
  /// @par Completion Signature
  /// @code void(std::error_code, dma::kv::GetResult) @endcode
  template <asio::completion_token_for<void(std::error_code, GetResult)> CompletionToken = default_token_type>
  auto async_get(const GetRequest& request, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code, GetResult)>(
        [this](auto handler, std::string&& key, const GetRequest& r) {
          auto slot = asio::get_associated_cancellation_slot(handler);
          start_get(std::move(key), r, wrap<GetResult>(std::move(handler)), slot);
        },
        token, std::string(request.key), request);
  }
  /// DMA.GET into `into`, which lies inside `region`.
  template <asio::completion_token_for<void(std::error_code, GetResult)> CompletionToken = default_token_type>
  auto async_get(std::string_view key, const Target::Region& region, std::span<std::byte> into,
                 CompletionToken&& token = default_token_type()) {
    return async_get(GetRequest{key, into, &region, {}}, std::forward<CompletionToken>(token));
  }

  /// Closes every node connection; pending commands complete with client_error::aborted, and so
  /// does every command started afterwards.
  void close();
  /// Commands started and not yet completed.
  std::size_t pending() const noexcept;
  /// What the client has done so far.
  ClusterStats stats() const noexcept;
  /// The primaries of the slot map, `host:port` each, in slot order.
  std::vector<std::string> primaries() const;
  /// The node (`host:port`) the slot map names for `key`'s slot; empty when none does.
  std::string node_of(std::string_view key) const;

 private:
  struct Impl;

  template <typename Result, typename Handler>
  detail::CompletionPtr<Result> wrap(Handler&& handler) {
    using For = detail::CompletionFor<Result, std::decay_t<Handler>, executor_type>;
    return For::create(std::forward<Handler>(handler), get_executor());
  }

  void start_connect(std::string&& host, std::uint16_t port, detail::CompletionPtr<detail::NoResult> completion,
                     asio::cancellation_slot slot);
  void start_set(std::string&& key, const SetRequest& request, detail::CompletionPtr<SetResult> completion,
                 asio::cancellation_slot slot);
  void start_get(std::string&& key, const GetRequest& request, detail::CompletionPtr<GetResult> completion,
                 asio::cancellation_slot slot);

  std::shared_ptr<Impl> impl_;
};

}  // namespace dma::kv
