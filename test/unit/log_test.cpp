// The logging hook: silent by default, thresholds, a service's handler over the process-wide one,
// and set_log_handler()'s promise that a replaced handler is no longer running when it returns.
#include "log.hpp"

#include <dma/configuration.hpp>
#include <dma/log.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../catch.hpp"

namespace {

using dma::LogLevel;

struct Heard {
  std::mutex mutex;
  std::vector<std::pair<LogLevel, std::string>> messages;

  dma::LogHandler handler(LogLevel threshold = LogLevel::debug) {
    return dma::LogHandler(
        [this](LogLevel level, std::string_view message) {
          std::lock_guard lock(mutex);
          messages.emplace_back(level, std::string(message));
        },
        threshold);
  }
  std::size_t size() {
    std::lock_guard lock(mutex);
    return messages.size();
  }
};

// Puts the process-wide handler back as it was, whatever the test did.
struct ProcessHandler {
  explicit ProcessHandler(dma::LogHandler handler) : previous(dma::set_log_handler(std::move(handler))) {}
  ~ProcessHandler() { dma::set_log_handler(std::move(previous)); }
  dma::LogHandler previous;
};

}  // namespace

TEST_CASE("without a handler nothing is logged and nothing is formatted", "[log]") {
  ProcessHandler none{dma::LogHandler()};
  const dma::detail::Log log;
  int formatted = 0;
  for (const auto level : {LogLevel::debug, LogLevel::info, LogLevel::warning, LogLevel::error}) {
    CHECK_FALSE(log.enabled(level));
    log(level, [&] {
      ++formatted;
      return std::string("never");
    });
  }
  CHECK(formatted == 0);
  CHECK_FALSE(dma::Configuration().log_handler);
}

TEST_CASE("the process-wide handler hears the messages at or above its threshold", "[log]") {
  Heard heard;
  ProcessHandler installed{heard.handler(LogLevel::warning)};
  const dma::detail::Log log;
  int formatted = 0;
  auto text = [&](const char* message) {
    return [&formatted, message] {
      ++formatted;
      return std::string(message);
    };
  };
  log(LogLevel::debug, text("debug"));
  log(LogLevel::info, text("info"));
  log(LogLevel::warning, text("warning"));
  log(LogLevel::error, "error");  // a literal needs no function
  CHECK(formatted == 1);          // only the warning was formatted
  REQUIRE(heard.size() == 2);
  CHECK(heard.messages[0] == std::pair{LogLevel::warning, std::string("warning")});
  CHECK(heard.messages[1] == std::pair{LogLevel::error, std::string("error")});
}

TEST_CASE("a service's handler wins over the process-wide one", "[log]") {
  Heard process, service;
  ProcessHandler installed{process.handler(LogLevel::debug)};
  dma::Configuration configuration;
  configuration.log_handler = service.handler(LogLevel::warning);
  const dma::detail::Log log(configuration.log_handler);
  log(LogLevel::info, "below the service's threshold");
  log(LogLevel::error, "a CQ error");
  REQUIRE(service.size() == 1);
  CHECK(service.messages[0].second == "a CQ error");
  CHECK(process.size() == 0);  // not even the info the service's handler dropped

  const dma::detail::Log other;  // a service without a handler of its own
  other(LogLevel::info, "from another service");
  CHECK(process.size() == 1);
}

TEST_CASE("set_log_handler returns the handler it replaces; an empty one silences", "[log]") {
  Heard first, second;
  const dma::LogHandler first_handler = first.handler();
  ProcessHandler installed{first_handler};
  const dma::LogHandler replaced = dma::set_log_handler(second.handler());
  CHECK(replaced == first_handler);
  const dma::detail::Log log;
  log(LogLevel::info, "to the second");
  CHECK(first.size() == 0);
  CHECK(second.size() == 1);
  dma::set_log_handler(dma::LogHandler());
  CHECK_FALSE(log.enabled(LogLevel::error));
  log(LogLevel::error, "to no one");
  CHECK(second.size() == 1);
}

TEST_CASE("a handler that throws does not stop the next message", "[log]") {
  int calls = 0;
  ProcessHandler installed{dma::LogHandler([&](LogLevel, std::string_view) {
    if (++calls == 1) throw std::runtime_error("handler failed");
  })};
  const dma::detail::Log log;
  log(LogLevel::warning, "first");
  log(LogLevel::warning, "second");
  CHECK(calls == 2);
}

TEST_CASE("a handler may log through the library and replace itself", "[log]") {
  Heard after;
  std::vector<std::string> heard;
  ProcessHandler installed{dma::LogHandler([&](LogLevel, std::string_view message) {
    heard.emplace_back(message);
    if (message == "outer") dma::detail::process_log(LogLevel::info, "nested");
    if (message == "replace") dma::set_log_handler(after.handler());
  })};
  const dma::detail::Log log;
  log(LogLevel::info, "outer");
  log(LogLevel::info, "replace");
  log(LogLevel::info, "to the new one");
  CHECK(heard == std::vector<std::string>{"outer", "nested", "replace"});
  REQUIRE(after.size() == 1);
  CHECK(after.messages[0].second == "to the new one");
}

TEST_CASE("once set_log_handler returns, the replaced handler is not running and never runs again", "[log]") {
  struct State {
    std::atomic<bool> retired{false};
    std::atomic<int> inside{0};
    std::atomic<int> late{0};  // calls that ran after retirement
  };
  auto handler_for = [](const std::shared_ptr<State>& state) {
    return dma::LogHandler([state](LogLevel, std::string_view) {
      state->inside.fetch_add(1);
      if (state->retired.load()) state->late.fetch_add(1);
      for (int i = 0; i < 200; ++i)  // stay inside a little, so the swap meets calls in progress
        std::atomic_signal_fence(std::memory_order_seq_cst);
      if (state->retired.load()) state->late.fetch_add(1);
      state->inside.fetch_sub(1);
    });
  };
  std::vector<std::shared_ptr<State>> states{std::make_shared<State>()};
  ProcessHandler installed{handler_for(states.back())};

  std::atomic<bool> stop{false};
  std::vector<std::thread> loggers;
  for (int t = 0; t < 3; ++t) {
    loggers.emplace_back([&] {
      const dma::detail::Log log;
      for (int i = 0; i < 2'000'000 && !stop.load(); ++i)
        log(LogLevel::warning, "message");
    });
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int late = 0;
  for (int swap = 0; swap < 300 && std::chrono::steady_clock::now() < until; ++swap) {
    states.push_back(std::make_shared<State>());
    dma::set_log_handler(handler_for(states.back()));
    auto& old = *states[states.size() - 2];
    late += old.inside.load();  // must be 0: nobody is still in it
    old.retired = true;
  }
  stop = true;
  for (auto& thread : loggers)
    thread.join();
  for (const auto& state : states)
    late += state->late.load();
  CHECK(late == 0);
}

TEST_CASE("configuration copies share their log handler; separate handlers differ", "[log][configuration]") {
  dma::Configuration a;
  a.log_handler = [](LogLevel, std::string_view) {};
  const dma::Configuration b = a;
  CHECK(a == b);
  dma::Configuration c = a;
  c.log_handler = [](LogLevel, std::string_view) {};
  CHECK_FALSE(a == c);
  CHECK_FALSE(a.log_handler == dma::LogHandler());
  // No file holds a handler: the round trip drops it, and keeps everything else.
  dma::Configuration read = dma::Configuration::from_toml_string(a.to_toml());
  CHECK_FALSE(read.log_handler);
  read.log_handler = a.log_handler;
  CHECK(read == a);
}

TEST_CASE("an empty std::function makes a silent handler", "[log]") {
  const dma::LogHandler handler(dma::LogHandler::Function{}, LogLevel::debug);
  CHECK_FALSE(handler);
  CHECK_FALSE(handler.enabled(LogLevel::error));
  handler(LogLevel::error, "dropped");  // no call through an empty function
}

TEST_CASE("log levels have names", "[log]") {
  CHECK(dma::to_string(LogLevel::debug) == "debug");
  CHECK(dma::to_string(LogLevel::info) == "info");
  CHECK(dma::to_string(LogLevel::warning) == "warning");
  CHECK(dma::to_string(LogLevel::error) == "error");
}

TEST_CASE("log_to_stderr writes one line per message at or above its threshold", "[log]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  const auto handler = dma::log_to_stderr(LogLevel::warning);
  handler(LogLevel::info, "quiet");
  handler(LogLevel::warning, "peer unreachable: no connection within 1s");
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fds[1]);
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;)
    text.append(buffer, static_cast<std::size_t>(n));
  ::close(fds[0]);
  CHECK(text == "dma-libfabric warning: peer unreachable: no connection within 1s\n");
}
