#include "value_workers.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

namespace dma_module {

ValueWorkers::ValueWorkers(std::size_t threads, const char* name, std::function<void()> on_start) {
  threads = std::max<std::size_t>(threads, 1);
  for (std::size_t i = 0; i < threads; ++i)
    workers_.push_back(std::make_unique<Worker>());
  for (std::size_t i = 0; i < threads; ++i) {
    char thread_name[16];  // the kernel's limit, the null included
    std::snprintf(thread_name, sizeof thread_name, "%.12s-%02u", name, static_cast<unsigned>(i % 100));
    Worker& worker = *workers_[i];
    worker.thread = std::thread([this, &worker, on_start, label = std::string(thread_name)] {
      pthread_setname_np(pthread_self(), label.c_str());
      if (on_start) on_start();
      run(worker);
    });
  }
}

ValueWorkers::~ValueWorkers() { join(); }

// Returns whether the queue was empty: then the worker may be asleep, and only a notify wakes it.
bool ValueWorkers::push(Worker& worker, Node* node) {
  Node* old = worker.head.load(std::memory_order_relaxed);
  do {
    node->next = old;
  } while (!worker.head.compare_exchange_weak(old, node, std::memory_order_release, std::memory_order_relaxed));
  return old == nullptr;
}

bool ValueWorkers::post(Job job) {
  auto node = std::make_unique<Node>();
  node->job = std::move(job);
  if (!node->job) return false;
  const std::lock_guard lock(post_mutex_);
  if (closed_) return false;
  may_sleep_ |= push(*workers_[current_], node.release());
  posted_ = true;
  return true;
}

void ValueWorkers::wake() {
  const std::lock_guard lock(post_mutex_);
  if (!posted_) return;
  // A worker that is awake finds the jobs without this; notify_one makes no system call when
  // nobody waits.
  if (may_sleep_) workers_[current_]->head.notify_one();
  current_ = (current_ + 1) % workers_.size();
  posted_ = may_sleep_ = false;
}

void ValueWorkers::run(Worker& worker) {
  for (;;) {
    Node* list = worker.head.exchange(nullptr, std::memory_order_acquire);
    if (list == nullptr) {
      worker.head.wait(nullptr, std::memory_order_acquire);
      continue;
    }
    Node* oldest_first = nullptr;  // the stack is newest first: reverse it
    while (list != nullptr)
      oldest_first = std::exchange(list, std::exchange(list->next, oldest_first));
    bool stop = false;
    while (oldest_first != nullptr) {
      std::unique_ptr<Node> node(std::exchange(oldest_first, oldest_first->next));
      if (!node->job) {
        stop = true;  // nothing is posted after the stop
        continue;
      }
      try {
        node->job();
      } catch (...) {
        failed_.fetch_add(1, std::memory_order_relaxed);
      }
      ran_.fetch_add(1, std::memory_order_relaxed);
    }
    if (stop) return;
  }
}

void ValueWorkers::join() {
  {
    const std::lock_guard lock(post_mutex_);
    if (closed_) return;
    closed_ = true;
    for (auto& worker : workers_) {
      push(*worker, new Node);  // the stop, behind every job posted before
      worker->head.notify_one();
    }
  }
  for (auto& worker : workers_)
    if (worker->thread.joinable() && worker->thread.get_id() != std::this_thread::get_id()) worker->thread.join();
}

}  // namespace dma_module
