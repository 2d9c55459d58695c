#include "dma/kv/callback_client.hpp"

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <future>
#include <optional>
#include <thread>

namespace dma::kv {
namespace {

std::atomic<unsigned> client_thread_counter{0};

}  // namespace

struct CallbackClient::State {
  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::optional<Client> client;
  HelloReply hello;
  std::thread thread;
  std::atomic<std::thread::id> thread_id{};

  bool on_own_thread() const noexcept { return std::this_thread::get_id() == thread_id.load(); }

  void stop() {
    if (!thread.joinable()) return;
    client->close();
    work.reset();  // run() returns once the closed connection's handlers have run
    thread.join();
  }

  ~State() {
    stop();
    client.reset();
  }

  // Runs a command and waits for its result; not on the client's thread.
  template <typename Result, typename Start>
  Result wait(const char* name, Start start, std::error_code& ec) {
    if (on_own_thread()) {
      ec = client_error::invalid_argument;
      Result result;
      result.detail = std::string(name) + ": the blocking form was called from the client's own thread (a callback)";
      return result;
    }
    std::promise<std::pair<std::error_code, Result>> promise;
    auto future = promise.get_future();
    start([&promise](std::error_code e, Result r) { promise.set_value({e, std::move(r)}); });
    auto [e, r] = future.get();
    ec = e;
    return std::move(r);
  }
};

CallbackClient::CallbackClient(std::unique_ptr<State> state) : state_(std::move(state)) {}

CallbackClient::~CallbackClient() = default;

std::unique_ptr<CallbackClient> CallbackClient::start(const std::string& host, std::uint16_t port, ClientTarget& target,
                                                      const ClientOptions& options) {
  std::error_code ec;
  std::string detail;
  auto client = start(host, port, target, options, ec, &detail);
  if (ec) throw std::system_error(ec, detail);
  return client;
}

std::unique_ptr<CallbackClient> CallbackClient::start(const std::string& host, std::uint16_t port, ClientTarget& target,
                                                      const ClientOptions& options, std::error_code& ec,
                                                      std::string* detail) {
  ec.clear();
  auto state = std::make_unique<State>();
  state->work.emplace(state->io.get_executor());
  state->client.emplace(state->io.get_executor(), target, options);
  const unsigned number = client_thread_counter.fetch_add(1);
  State* s = state.get();
  state->thread = std::thread([s, number] {
    char name[16];
    std::snprintf(name, sizeof name, "kv-client-%02u", number % 100);
    pthread_setname_np(pthread_self(), name);
    s->thread_id = std::this_thread::get_id();
    s->io.run();
  });
  std::promise<std::error_code> connected;
  state->client->async_connect(host, port, [&connected](std::error_code e) { connected.set_value(e); });
  ec = connected.get_future().get();
  if (ec) {
    if (detail) *detail = "connecting to " + host + ":" + std::to_string(port) + ": " + ec.message();
    return nullptr;
  }
  std::promise<std::pair<std::error_code, HelloResult>> hello;
  state->client->async_hello([&hello](std::error_code e, HelloResult r) { hello.set_value({e, std::move(r)}); });
  auto [e, result] = hello.get_future().get();
  if (e) {
    ec = e;
    if (detail) *detail = result.detail;
    return nullptr;
  }
  state->hello = std::move(result.reply);
  return std::unique_ptr<CallbackClient>(new CallbackClient(std::move(state)));
}

void CallbackClient::set(const SetRequest& request, std::function<void(std::error_code, SetResult)> done) {
  state_->client->async_set(request, std::move(done));
}

void CallbackClient::get(const GetRequest& request, std::function<void(std::error_code, GetResult)> done) {
  state_->client->async_get(request, std::move(done));
}

void CallbackClient::info(std::function<void(std::error_code, InfoResult)> done) {
  state_->client->async_info(std::move(done));
}

SetResult CallbackClient::set(const SetRequest& request, std::error_code& ec) {
  return state_->wait<SetResult>(
      "DMA.SET", [&](auto done) { state_->client->async_set(request, std::move(done)); }, ec);
}

GetResult CallbackClient::get(const GetRequest& request, std::error_code& ec) {
  return state_->wait<GetResult>(
      "DMA.GET", [&](auto done) { state_->client->async_get(request, std::move(done)); }, ec);
}

InfoResult CallbackClient::info(std::error_code& ec) {
  return state_->wait<InfoResult>(
      "DMA.INFO", [&](auto done) { state_->client->async_info(std::move(done)); }, ec);
}

const HelloReply& CallbackClient::hello() const noexcept { return state_->hello; }

std::size_t CallbackClient::pending() const noexcept { return state_->client->pending(); }

bool CallbackClient::is_open() const noexcept { return state_->client->is_open(); }

}  // namespace dma::kv
