#include "dma/target_thread.hpp"

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

namespace dma {
namespace {

std::atomic<unsigned> target_thread_counter{0};

void bind_to(int cpu) {
  if (cpu < 0) return;
  if (cpu >= CPU_SETSIZE) {
    throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                            "TargetThread: CPU " + std::to_string(cpu) + " is beyond what a cpu_set_t holds");
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "TargetThread: sched_setaffinity to CPU " + std::to_string(cpu));
  }
}

}  // namespace

struct TargetThread::State {
  asio::io_context io{1};
  std::optional<Target> target;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::thread thread;
  std::atomic<pid_t> tid{0};
  std::mutex mutex;  ///< pause() and resume()
  int cpu = -1;
  std::string name;

  // Starts the thread and returns once it runs, or rethrows why it could not bind to its CPU.
  void run() {
    std::mutex started_mutex;
    std::condition_variable ready;
    bool started = false;
    std::exception_ptr failure;
    io.restart();
    thread = std::thread([this, &started_mutex, &ready, &started, &failure] {
      pthread_setname_np(pthread_self(), name.c_str());
      std::exception_ptr bound;
      try {
        bind_to(cpu);
      } catch (...) {
        bound = std::current_exception();
      }
      if (!bound) tid = gettid();
      {
        std::lock_guard lock(started_mutex);
        failure = bound;
        started = true;
        ready.notify_one();
      }
      if (!bound) io.run();
    });
    {
      std::unique_lock lock(started_mutex);
      ready.wait(lock, [&] { return started; });
    }
    if (failure) {
      thread.join();
      std::rethrow_exception(failure);
    }
  }
};

TargetThread::TargetThread(std::unique_ptr<State> state) : state_(std::move(state)) {}

std::unique_ptr<TargetThread> TargetThread::start(const Configuration& configuration) {
  return start(configuration, Options());
}

std::unique_ptr<TargetThread> TargetThread::start(const Configuration& configuration, const Options& options) {
  auto state = std::make_unique<State>();
  state->target.emplace(state->io, configuration);
  state->work.emplace(state->io.get_executor());
  state->cpu = options.cpu;
  state->name = options.name;
  if (state->name.empty()) {
    char text[16];
    std::snprintf(text, sizeof text, "target-%02u", target_thread_counter.fetch_add(1) % 100);
    state->name = text;
  }
  state->name.resize(std::min<std::size_t>(state->name.size(), 15));
  state->run();
  return std::unique_ptr<TargetThread>(new TargetThread(std::move(state)));
}

std::unique_ptr<TargetThread> TargetThread::start(const Configuration& configuration, const Options& options,
                                                  std::error_code& ec, std::string* detail) {
  ec.clear();
  try {
    return start(configuration, options);
  } catch (const std::system_error& error) {
    ec = error.code();
    if (detail) *detail = error.what();
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
    if (detail) *detail = "out of memory";
  }
  return nullptr;
}

TargetThread::~TargetThread() {
  pause();
  state_->target.reset();
}

void TargetThread::pause() {
  std::lock_guard lock(state_->mutex);
  if (!state_->thread.joinable()) return;
  state_->io.stop();  // the Target's progress never runs out of work by itself
  state_->thread.join();
  state_->tid = 0;
}

void TargetThread::resume() {
  std::lock_guard lock(state_->mutex);
  if (state_->thread.joinable()) return;
  state_->run();
}

Target& TargetThread::target() noexcept { return *state_->target; }

Target::Region TargetThread::expose(std::span<std::byte> buffer, Target::Access access) {
  return state_->target->expose(buffer, access);
}

pid_t TargetThread::thread_id() const noexcept { return state_->tid.load(); }

}  // namespace dma
