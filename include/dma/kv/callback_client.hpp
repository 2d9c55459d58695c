/// @file
/// dma::kv::CallbackClient: the side channel's client for code without Asio (a C event loop, a
/// thread pool). A dma::kv::Client on a thread of its own (`kv-client-NN`), whose commands take
/// std::function callbacks, as dma::FabricService does for the fabric service.
#pragma once

#include <dma/export.hpp>
#include <dma/kv/client.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <system_error>

namespace dma::kv {

/// One connection to one server, its DMA.HELLO sent, on a thread of its own. Member functions may
/// be called from any thread, callbacks included; callbacks run on the client's thread, one at a
/// time, and must not block (the blocking forms below must not be called from them). Pipelining,
/// deadlines, errors and the buffers' rules are dma::kv::Client's.
class DMA_EXPORT CallbackClient {
 public:
  /// Connects to `host`:`port`, sends DMA.HELLO with `target`'s address, and returns once the
  /// server answered. Throws std::system_error (a client_error, or the connection's error) whose
  /// what() says what happened.
  static std::unique_ptr<CallbackClient> start(const std::string& host, std::uint16_t port, ClientTarget& target,
                                               const ClientOptions& options = {});
  /// As start() above; on failure sets ec and `detail` (when given) and returns null.
  static std::unique_ptr<CallbackClient> start(const std::string& host, std::uint16_t port, ClientTarget& target,
                                               const ClientOptions& options, std::error_code& ec,
                                               std::string* detail = nullptr);
  /// Closes the connection (pending commands' callbacks run with client_error::aborted) and joins
  /// the thread. Not from a callback.
  ~CallbackClient();
  CallbackClient(const CallbackClient&) = delete;
  CallbackClient& operator=(const CallbackClient&) = delete;

  /// DMA.SET; `done` runs on the client's thread.
  void set(const SetRequest& request, std::function<void(std::error_code, SetResult)> done);
  /// DMA.GET; `done` runs on the client's thread.
  void get(const GetRequest& request, std::function<void(std::error_code, GetResult)> done);
  /// DMA.INFO; `done` runs on the client's thread.
  void info(std::function<void(std::error_code, InfoResult)> done);

  /// DMA.SET, blocking until it completes. Not from a callback (client_error::invalid_argument).
  SetResult set(const SetRequest& request, std::error_code& ec);
  /// DMA.GET, blocking until it completes. Not from a callback (client_error::invalid_argument).
  GetResult get(const GetRequest& request, std::error_code& ec);
  /// DMA.INFO, blocking until it completes. Not from a callback (client_error::invalid_argument).
  InfoResult info(std::error_code& ec);

  /// What DMA.HELLO answered.
  const HelloReply& hello() const noexcept;
  /// Commands sent and not yet completed.
  std::size_t pending() const noexcept;
  /// False once the connection closed (the server went, a deadline passed): every command then
  /// fails with client_error::not_connected; start a new CallbackClient.
  bool is_open() const noexcept;

 private:
  struct State;
  explicit CallbackClient(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace dma::kv
