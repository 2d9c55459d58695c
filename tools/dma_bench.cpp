// dma-bench: the library against a plain libfabric loop, side by side, over tcp on 127.0.0.1.
//
// Sweeps transfer size, direction, depth, API (awaitable, handler, callback, and raw as an A/A
// control) and wait mode (fd, adaptive, busy). Every point is measured interleaved with the raw
// loop at the same size, direction, depth and wait mode (A, B, B, A, ...), and reported as medians
// with the ratio.
// The target is a child process (`dma-bench --serve`) unless --target inprocess.
#include <dma/dma.hpp>

#include <poll.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

Clock::duration span_of(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// How often thread `tid` of this process went to sleep (its voluntary context switches): for the
// target's progress thread, each one is a wake-up that a writer over loopback pays in its sendmsg.
std::uint64_t voluntary_switches(pid_t tid) {
  std::FILE* file = std::fopen(("/proc/self/task/" + std::to_string(tid) + "/status").c_str(), "r");
  if (file == nullptr) return 0;
  char line[256];
  std::uint64_t count = 0;
  while (std::fgets(line, sizeof line, file) != nullptr) {
    if (std::sscanf(line, "voluntary_ctxt_switches: %" SCNu64, &count) == 1) break;
  }
  std::fclose(file);
  return count;
}

std::size_t parse_size(const std::string& text) {
  std::size_t end = 0;
  const std::size_t value = std::stoull(text, &end);
  const std::string unit = text.substr(end);
  if (unit.empty() || unit == "B") return value;
  if (unit == "K" || unit == "KiB") return value << 10;
  if (unit == "M" || unit == "MiB") return value << 20;
  if (unit == "G" || unit == "GiB") return value << 30;
  throw std::invalid_argument("unknown size unit in " + text);
}

std::string size_text(std::size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

dma::WaitMode wait_mode(const std::string& name) {
  if (name == "fd") return dma::WaitMode::fd;
  if (name == "adaptive") return dma::WaitMode::adaptive;
  if (name == "busy") return dma::WaitMode::busy_poll;
  throw std::invalid_argument("unknown wait mode " + name);
}

// Binds the calling thread, and every thread it starts afterwards, to one CPU (`--pin`).
void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    throw std::system_error(errno, std::generic_category(), "sched_setaffinity to CPU " + std::to_string(cpu));
  }
}

// Runs io on a new thread bound to cpu (-1: anywhere) and returns once the thread has stored its id
// in tid, so that voluntary_switches(tid) answers from the first query on.
std::thread start_progress_thread(asio::io_context& io, int cpu, std::atomic<pid_t>& tid) {
  std::thread thread([&io, &tid, cpu] {
    pin_to(cpu);
    tid = gettid();
    io.run();
  });
  while (tid.load() == 0)
    std::this_thread::yield();
  return thread;
}

// The initiator's buffers: plain pages, or (--hugepages) 2 MiB-aligned memory that the kernel is
// asked to back with transparent huge pages.
class LocalBuffer {
 public:
  LocalBuffer(std::size_t size, bool huge) : size_(size) {
    constexpr std::size_t huge_page = std::size_t{2} << 20;
    mapped_ = huge ? size + huge_page : size;
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap of the local buffer");
    base_ = static_cast<std::byte*>(p);
    data_ = base_;
    if (huge) {
      const auto address = reinterpret_cast<std::uintptr_t>(base_);
      data_ = base_ + ((huge_page - address % huge_page) % huge_page);
      if (madvise(data_, size, MADV_HUGEPAGE) != 0) std::perror("dma-bench: madvise(MADV_HUGEPAGE)");
    }
    std::memset(data_, 0xa5, size);
  }
  ~LocalBuffer() { munmap(base_, mapped_); }
  LocalBuffer(const LocalBuffer&) = delete;
  LocalBuffer& operator=(const LocalBuffer&) = delete;
  std::span<std::byte> bytes() const { return {data_, size_}; }

 private:
  std::size_t size_ = 0, mapped_ = 0;
  std::byte* base_ = nullptr;
  std::byte* data_ = nullptr;
};

// What shapes the numbers besides the library: printed with every report. Over loopback the
// kernel's congestion control sets the level (cubic runs 1 MiB writes ~1.7x faster than bbr here).
std::string environment_line(const std::string& provider) {
  auto first_line = [](const char* path) {
    std::FILE* file = std::fopen(path, "r");
    if (file == nullptr) return std::string("?");
    char buffer[256] = {};
    const bool ok = std::fgets(buffer, sizeof buffer, file) != nullptr;
    std::fclose(file);
    std::string text = ok ? buffer : "?";
    while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
      text.pop_back();
    return text;
  };
  return "libfabric " + dma::fabric_version() + ", provider " + provider + ", tcp_congestion_control " +
         first_line("/proc/sys/net/ipv4/tcp_congestion_control") + ", " +
         std::to_string(std::thread::hardware_concurrency()) + " CPUs";
}

// ---- the target ------------------------------------------------------------------------------

// `--serve`: expose a region, print its advertisement, answer "usage" with this process's CPU time
// and how often its progress thread slept, exit on end of input.
int serve(const std::string& bind, std::size_t region_size, const std::string& wait, int cpu) {
  pin_to(cpu);
  dma::Configuration configuration;
  configuration.bind = bind;
  configuration.wait_mode = wait_mode(wait);
  asio::io_context io;
  dma::Target target(io, configuration);
  std::vector<std::byte> region(region_size, std::byte{0x5a});
  auto exposed = target.expose(region);
  auto work = asio::make_work_guard(io);
  std::atomic<pid_t> progress_tid{0};
  std::thread progress = start_progress_thread(io, -1, progress_tid);  // the process is pinned already
  std::printf("advertisement: %s\n", exposed.advertisement().to_string().c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "usage") {
      std::printf("usage %.6f %" PRIu64 "\n", cpu_seconds(), voluntary_switches(progress_tid.load()));
    }
    std::fflush(stdout);
  }
  work.reset();
  io.stop();
  progress.join();
  return 0;
}

struct TargetUsage {
  double cpu = 0;            ///< CPU seconds of the target process (0 in process: the initiator's has it)
  std::uint64_t sleeps = 0;  ///< voluntary context switches of its progress thread
};

// The target as a child process, spoken to over pipes.
class ChildTarget {
 public:
  ChildTarget(const std::string& self, const std::string& bind, std::size_t region_size, const std::string& wait,
              int cpu) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, to_child[1]);
    posix_spawn_file_actions_addclose(&actions, from_child[0]);
    std::vector<std::string> args = {
        self, "--serve",     "--bind",           bind, "--region", std::to_string(region_size), "--target-wait",
        wait, "--serve-cpu", std::to_string(cpu)};
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, self.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    if (rc != 0) throw std::runtime_error("cannot start the target: " + std::string(std::strerror(rc)));
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
    const std::string line = read_line();
    const std::string prefix = "advertisement: ";
    if (line.rfind(prefix, 0) != 0) throw std::runtime_error("the target printed: " + line);
    advertisement_ = dma::Advertisement::parse(line.substr(prefix.size()));
  }
  ~ChildTarget() {
    std::fclose(in_);
    int status = 0;
    for (int i = 0; i < 500 && waitpid(pid_, &status, WNOHANG) == 0; ++i)
      usleep(10000);
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    std::fclose(out_);
  }
  const dma::Advertisement& advertisement() const { return advertisement_; }
  /// The target process's CPU seconds and its progress thread's sleeps so far.
  TargetUsage usage() {
    std::fputs("usage\n", in_);
    std::fflush(in_);
    const std::string line = read_line();
    TargetUsage u;
    if (std::sscanf(line.c_str(), "usage %lf %" SCNu64, &u.cpu, &u.sleeps) != 2) {
      throw std::runtime_error("the target answered: " + line);
    }
    return u;
  }

 private:
  std::string read_line() {
    char buffer[1024];
    if (std::fgets(buffer, sizeof buffer, out_) == nullptr) throw std::runtime_error("the target exited");
    std::string line = buffer;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r'))
      line.pop_back();
    return line;
  }
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  dma::Advertisement advertisement_;
};

// The target on a thread of this process (its CPU then shows up in the initiator's).
class InProcessTarget {
 public:
  InProcessTarget(const std::string& bind, std::size_t region_size, const std::string& wait, int cpu)
      : target_(io_, configuration(bind, wait)),
        region_(region_size, std::byte{0x5a}),
        work_(asio::make_work_guard(io_)) {
    exposed_ = target_.expose(region_);
    thread_ = start_progress_thread(io_, cpu, tid_);
  }
  TargetUsage usage() const { return {0, voluntary_switches(tid_.load())}; }
  ~InProcessTarget() {
    work_.reset();
    io_.stop();
    thread_.join();
  }
  const dma::Advertisement& advertisement() const { return exposed_.advertisement(); }

 private:
  static dma::Configuration configuration(const std::string& bind, const std::string& wait) {
    dma::Configuration c;
    c.bind = bind;
    c.wait_mode = wait_mode(wait);
    return c;
  }
  asio::io_context io_;
  dma::Target target_;
  std::vector<std::byte> region_;
  dma::Target::Region exposed_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::atomic<pid_t> tid_{0};
  std::thread thread_;
};

// ---- measurements ------------------------------------------------------------------------------

struct Point {
  std::string api;  // awaitable, callback, raw
  dma::Direction direction;
  std::size_t size;
  int depth;
  std::string wait;
};

struct Sample {
  double seconds = 0;
  std::uint64_t transfers = 0;
  std::uint64_t errors = 0;
  double cpu_initiator = 0;
  double cpu_target = 0;
  std::uint64_t target_sleeps = 0;  ///< times the target's progress thread slept during the run
  std::vector<double> latencies_us;
};

struct Slice {
  std::span<std::byte> bytes;
  Clock::time_point started;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t) const { return bytes; }
};

struct Setup {
  dma::Advertisement peer;
  std::chrono::nanoseconds spin_budget{std::chrono::microseconds(50)};
  std::string bind;
  std::span<std::byte> local;
  double duration;
  int max_depth = 64;

  /// What both sides open their endpoints with: the same CQ (wait object, size) and credits.
  dma::Configuration configuration(const std::string& wait) const {
    dma::Configuration c;
    c.bind = bind;
    c.wait_mode = wait_mode(wait);
    c.spin_budget = spin_budget;
    c.max_in_flight = static_cast<std::size_t>(std::max(64, max_depth));
    return c;
  }
};

dma::TransferRequest<Slice> request_for(const Setup& setup, const Point& point, int lane) {
  dma::TransferRequest<Slice> r;
  r.client_id = 1;
  r.peer_address = setup.peer.address;
  r.remote_key = setup.peer.remote_key;
  r.remote_address = setup.peer.remote_address + static_cast<std::uint64_t>(lane) * point.size;
  r.direction = point.direction;
  r.length = point.size;
  r.caller_context.bytes = setup.local.subspan(static_cast<std::size_t>(lane) * point.size, point.size);
  return r;
}

void record(Sample& sample, const dma::Outcome& outcome, Clock::time_point started, bool latency) {
  ++sample.transfers;
  if (!outcome) ++sample.errors;
  if (latency) {
    sample.latencies_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - started).count());
  }
}

// One library service per wait mode and API, opened once and reused across points.
class Library {
 public:
  Library(const Setup& setup) : setup_(setup) {}

  /// Opens the service a point needs ahead of time, so setup never counts as transfer cost.
  void prepare(const Point& point) {
    if (point.api == "callback") {
      (void)callback_service(point.wait);
    } else {
      (void)async_service(point.wait);
    }
  }

  Sample awaitable(const Point& point) {
    auto& service = async_service(point.wait);
    Sample sample;
    const auto end = Clock::now() + span_of(setup_.duration);
    const bool latency = point.depth == 1;
    auto lane = [&](int index) -> asio::awaitable<void> {
      while (Clock::now() < end) {
        auto request = request_for(setup_, point, index);
        request.caller_context.started = Clock::now();
        auto [slice, outcome] = co_await service.submit(std::move(request));
        record(sample, outcome, slice.started, latency);
      }
    };
    const auto start = Clock::now();
    for (int i = 0; i < point.depth; ++i)
      asio::co_spawn(io_, lane(i), asio::detached);
    sample.seconds = run_lanes(start);
    return sample;
  }

  // Runs the io_context until every lane has stopped; seconds since start.
  double run_lanes(Clock::time_point start) {
    io_.restart();
    io_.run();
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // The same service with a plain completion handler that resubmits: no coroutine anywhere.
  Sample handler(const Point& point) {
    auto& service = async_service(point.wait);
    Sample sample;
    struct Lane {
      dma::asynchronous::FabricService<Slice>* service;
      Sample* sample;
      const Setup* setup;
      const Point* point;
      Clock::time_point end;
      int index;
      void start() {
        auto request = request_for(*setup, *point, index);
        request.caller_context.started = Clock::now();
        service->submit(std::move(request), [this](dma::Completion<Slice> done) {
          record(*sample, done.outcome, done.caller_context.started, point->depth == 1);
          if (Clock::now() < end) start();
        });
      }
    };
    std::vector<Lane> lanes;
    lanes.reserve(static_cast<std::size_t>(point.depth));
    const auto end = Clock::now() + span_of(setup_.duration);
    const auto start = Clock::now();
    for (int i = 0; i < point.depth; ++i) {
      lanes.push_back(Lane{&service, &sample, &setup_, &point, end, i});
      lanes.back().start();
    }
    sample.seconds = run_lanes(start);
    return sample;
  }

  Sample callback(const Point& point) {
    auto& service = callback_service(point.wait);
    std::unique_lock lock(mutex_);
    sample_ = Sample{};
    point_ = point;
    end_ = Clock::now() + span_of(setup_.duration);
    lanes_ = point.depth;
    lock.unlock();
    const auto start = Clock::now();
    for (int i = 0; i < point.depth; ++i)
      submit(service, i);
    lock.lock();
    done_.wait(lock, [&] { return lanes_ == 0; });
    sample_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return sample_;
  }

  /// The engine counters of every service this run opened (printed for --only library).
  void print_metrics() const {
    auto line = [](const std::string& name, const dma::Metrics& m) {
      std::fprintf(stderr,
                   "%-18s posted %llu, cq_reads %llu, fd_wakeups %llu, spin_hits %llu, armed_late %llu, "
                   "eagain %llu, backstop_hits %llu, joined_pass %llu\n",
                   name.c_str(), static_cast<unsigned long long>(m.posted), static_cast<unsigned long long>(m.cq_reads),
                   static_cast<unsigned long long>(m.fd_wakeups), static_cast<unsigned long long>(m.spin_hits),
                   static_cast<unsigned long long>(m.armed_late), static_cast<unsigned long long>(m.eagain),
                   static_cast<unsigned long long>(m.backstop_hits), static_cast<unsigned long long>(m.joined_pass));
    };
    for (const auto& [wait, service] : async_)
      line("async " + wait + ":", service->metrics());
    for (const auto& [wait, service] : callback_)
      line("callback " + wait + ":", service->metrics());
  }

 private:
  dma::asynchronous::FabricService<Slice>& async_service(const std::string& wait) {
    auto& slot = async_[wait];
    if (!slot) slot = std::make_unique<dma::asynchronous::FabricService<Slice>>(io_, setup_.configuration(wait));
    return *slot;
  }

  // The completer resubmits on the fabric thread, keeping `depth` in flight.
  dma::FabricService<Slice>& callback_service(const std::string& wait) {
    auto& slot = callback_[wait];
    if (!slot) {
      slot = dma::FabricService<Slice>::start(
          setup_.configuration(wait),
          [this, wait](std::span<dma::Completion<Slice>> batch) {
            for (auto& completion : batch)
              completed(*callback_[wait], completion);
          },
          nullptr);
    }
    return *slot;
  }

  void submit(dma::FabricService<Slice>& service, int lane) {
    auto request = request_for(setup_, point_, lane);
    request.caller_context.started = Clock::now();
    (void)service.submit(std::move(request));
  }

  void completed(dma::FabricService<Slice>& service, const dma::Completion<Slice>& completion) {
    const auto lane = static_cast<int>((completion.caller_context.bytes.data() - setup_.local.data()) /
                                       static_cast<std::ptrdiff_t>(point_.size));
    record(sample_, completion.outcome, completion.caller_context.started, point_.depth == 1);
    if (Clock::now() < end_) return submit(service, lane);
    std::lock_guard lock(mutex_);
    if (--lanes_ == 0) done_.notify_all();
  }

  const Setup& setup_;
  asio::io_context io_;
  std::map<std::string, std::unique_ptr<dma::asynchronous::FabricService<Slice>>> async_;
  std::map<std::string, std::unique_ptr<dma::FabricService<Slice>>> callback_;
  std::mutex mutex_;
  std::condition_variable done_;
  Sample sample_;
  Point point_{};
  Clock::time_point end_;
  int lanes_ = 0;
};

// The baseline: the same transfers as a plain loop over fi_writemsg / fi_readmsg and fi_cq_read,
// with the same flags (FI_DELIVERY_COMPLETE on writes, FI_MORE inside bursts) and depth.
class Raw {
 public:
  explicit Raw(const Setup& setup) : setup_(setup) {}

  /// The provider the endpoint for this wait mode runs on, e.g. "tcp;ofi_rxm".
  std::string provider(const std::string& wait) {
    select(wait);
    return current_->endpoint->describe().provider;
  }

  Sample run(const Point& point) {
    select(point.wait);
    Sample sample;
    const auto mode = wait_mode(point.wait);
    const bool latency = point.depth == 1;
    std::vector<Op> ops(static_cast<std::size_t>(point.depth));
    std::vector<Op*> backlog;
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration<double>(setup_.duration);
    for (int i = 0; i < point.depth; ++i) {
      ops[static_cast<std::size_t>(i)].lane = i;
      backlog.push_back(&ops[static_cast<std::size_t>(i)]);
    }
    std::size_t in_flight = 0;
    fi_cq_entry entries[16];
    bool spinning = false;
    Clock::time_point spin_start;
    while (in_flight > 0 || !backlog.empty()) {
      post_backlog(point, backlog, in_flight);
      const ssize_t n = fi_cq_read(current_->endpoint->cq(), entries, 16);
      if (n > 0) {
        spinning = false;
        for (ssize_t i = 0; i < n; ++i) {
          auto* op = static_cast<Op*>(entries[i].op_context);
          --in_flight;
          ++sample.transfers;
          if (latency) sample.latencies_us.push_back(micros(op->started));
          if (Clock::now() < end) backlog.push_back(op);
        }
        continue;
      }
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry error{};
        if (fi_cq_readerr(current_->endpoint->cq(), &error, 0) > 0 && error.op_context != nullptr) {
          --in_flight;
          ++sample.transfers;
          ++sample.errors;
        }
        continue;
      }
      if (!backlog.empty() || mode == dma::WaitMode::busy_poll) continue;
      if (mode == dma::WaitMode::adaptive) {  // poll for up to the spin budget, as the library does
        if (!spinning) spin_start = Clock::now();
        spinning = true;
        if (Clock::now() - spin_start < setup_.spin_budget) continue;
      }
      spinning = false;
      wait_fd();
    }
    sample.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return sample;
  }

 private:
  struct Op {
    fi_context2 context{};  // first: the CQ hands this address back
    int lane = 0;
    Clock::time_point started;
  };

  static double micros(Clock::time_point started) {
    return std::chrono::duration<double, std::micro>(Clock::now() - started).count();
  }

  void post_backlog(const Point& point, std::vector<Op*>& backlog, std::size_t& in_flight) {
    std::size_t posted = 0;
    while (posted < backlog.size()) {
      Op* op = backlog[posted];
      const bool more = posted + 1 < backlog.size();
      std::byte* buffer = setup_.local.data() + static_cast<std::size_t>(op->lane) * point.size;
      iovec iov{buffer, point.size};
      void* desc = nullptr;
      fi_rma_iov rma{setup_.peer.remote_address + static_cast<std::uint64_t>(op->lane) * point.size, point.size,
                     setup_.peer.remote_key};
      fi_msg_rma msg{};
      msg.msg_iov = &iov;
      msg.desc = &desc;
      msg.iov_count = 1;
      msg.addr = current_->peer;
      msg.rma_iov = &rma;
      msg.rma_iov_count = 1;
      msg.context = op;
      op->started = Clock::now();
      const std::uint64_t flags = FI_COMPLETION | (more ? FI_MORE : 0);
      const ssize_t rc = point.direction == dma::Direction::ToPeer
                             ? fi_writemsg(current_->endpoint->endpoint(), &msg, flags | FI_DELIVERY_COMPLETE)
                             : fi_readmsg(current_->endpoint->endpoint(), &msg, flags);
      if (rc != 0) break;  // -FI_EAGAIN: retried after the next CQ read
      ++posted;
      ++in_flight;
    }
    backlog.erase(backlog.begin(), backlog.begin() + static_cast<std::ptrdiff_t>(posted));
  }

  // One endpoint per wait mode, opened as the library opens its service's: busy polling has a CQ
  // without a wait object (FI_WAIT_NONE), the other modes FI_WAIT_FD.
  void select(const std::string& wait) {
    auto& side = sides_[wait];
    if (!side.endpoint) {
      side.endpoint = std::make_unique<dma::Endpoint>();
      side.endpoint->open(setup_.configuration(wait));
      std::error_code ec;
      side.peer = side.endpoint->insert_address(setup_.peer.address, ec);
      if (ec) throw std::system_error(ec, "raw baseline: fi_av_insert");
    }
    current_ = &side;
  }

  // fi_trywait before blocking, as the library does; a wake without completions is legal.
  void wait_fd() {
    fid* fids[] = {&current_->endpoint->cq()->fid};
    if (fi_trywait(current_->endpoint->fabric(), fids, 1) != 0) return;
    pollfd p{current_->endpoint->wait_fd(), POLLIN, 0};
    (void)poll(&p, 1, 100);
  }

  struct Side {
    std::unique_ptr<dma::Endpoint> endpoint;
    fi_addr_t peer = FI_ADDR_NOTAVAIL;
  };
  const Setup& setup_;
  std::map<std::string, Side> sides_;
  Side* current_ = nullptr;
};

// ---- reporting ---------------------------------------------------------------------------------

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double percentile(std::vector<double>& values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<std::size_t>(p * static_cast<double>(values.size())))];
}

// A distribution-free 95 % confidence interval for the median of `values`: the k-th smallest and
// k-th largest value, with k the largest rank such that P(Binomial(n, 1/2) < k) <= 2.5 %. It holds
// for any distribution of independent runs; below 6 values no such k exists and {0, 0} comes back.
std::pair<double, double> median_interval(std::vector<double> values) {
  const std::size_t n = values.size();
  double tail = 0, term = std::pow(0.5, static_cast<double>(n));  // P(X = 0)
  std::size_t k = 0;
  for (std::size_t j = 0; j < n; ++j) {  // tail = P(X <= j)
    tail += term;
    if (tail > 0.025) break;
    k = j + 1;
    term *= static_cast<double>(n - j) / static_cast<double>(j + 1);
  }
  if (k == 0) return {0, 0};
  std::sort(values.begin(), values.end());
  return {values[k - 1], values[n - k]};
}

// The medians of one side's runs at a point (CPU is seconds per GiB moved).
struct Medians {
  double gbps = 0, mops = 0, cpu_init = 0, cpu_target = 0, p50 = 0, p99 = 0;
  double target_sleeps = 0;  ///< per transfer
  std::uint64_t errors = 0;
};

struct Row {
  Point point;
  Medians lib, raw;  ///< the measured side (library or A/A control) and the raw loop beside it
  double ratio = 0;  ///< median of the per-pair ratios (bandwidth from 64 KiB up, transfer rate below)
  double ratio_low = 0, ratio_high = 0;  ///< its 95 % confidence interval (0, 0: fewer than 6 pairs)
  int runs = 0;
  bool library_missing = false, raw_missing = false;  ///< --only: one side did not run
};

Medians medians_of(const Point& point, const std::vector<Sample>& runs) {
  std::vector<double> gbps, mops, cpu_i, cpu_t, p50, p99, sleeps;
  Medians m;
  for (auto s : runs) {  // a copy: percentile() sorts the latencies
    const double bytes = static_cast<double>(s.transfers) * static_cast<double>(point.size);
    gbps.push_back(bytes / s.seconds / 1e9);
    mops.push_back(static_cast<double>(s.transfers) / s.seconds / 1e6);
    const double gib = bytes / static_cast<double>(1u << 30);
    cpu_i.push_back(gib > 0 ? s.cpu_initiator / gib : 0);
    cpu_t.push_back(gib > 0 ? s.cpu_target / gib : 0);
    sleeps.push_back(s.transfers > 0 ? static_cast<double>(s.target_sleeps) / static_cast<double>(s.transfers) : 0);
    p50.push_back(percentile(s.latencies_us, 0.5));
    p99.push_back(percentile(s.latencies_us, 0.99));
    m.errors += s.errors;
  }
  m.gbps = median(gbps);
  m.mops = median(mops);
  m.cpu_init = median(cpu_i);
  m.cpu_target = median(cpu_t);
  m.target_sleeps = median(sleeps);
  m.p50 = median(p50);
  m.p99 = median(p99);
  return m;
}

Row summarise(const Point& point, const std::vector<Sample>& samples, const std::vector<Sample>& raw) {
  Row row{point, medians_of(point, samples), medians_of(point, raw)};
  row.runs = static_cast<int>(samples.size());
  row.library_missing = samples.empty();
  row.raw_missing = raw.empty();
  // Each library run sits next to its raw run in time, so the ratio of a pair cancels most drift.
  std::vector<double> ratios;
  for (std::size_t i = 0; i < samples.size() && i < raw.size(); ++i) {
    const double lib_rate = static_cast<double>(samples[i].transfers) / samples[i].seconds;
    const double raw_rate = static_cast<double>(raw[i].transfers) / raw[i].seconds;
    if (raw_rate > 0) ratios.push_back(lib_rate / raw_rate);
  }
  row.ratio = median(ratios);
  std::tie(row.ratio_low, row.ratio_high) = median_interval(ratios);
  return row;
}

const char* direction_text(dma::Direction d) { return d == dma::Direction::ToPeer ? "write" : "read"; }

void print_table(const std::vector<Row>& rows, bool child_target) {
  std::printf("%-9s %-5s %6s %5s %-8s %9s %9s %9s %9s %9s %9s %8s %9s %9s %8s %8s %12s\n", "api", "dir", "size",
              "depth", "wait", "GB/s", "Mxfer/s", "cpu-i/GiB", child_target ? "cpu-t/GiB" : "", "p50 us", "p99 us",
              "t-sleeps", "raw GB/s", "raw cpu-i", "raw t-sl", "lib/raw", "95% CI");
  for (const auto& r : rows) {
    const double ratio = r.ratio;
    char p50[16] = "-", p99[16] = "-", cpu_t[16] = "";
    if (r.point.depth == 1 && !r.library_missing) {
      std::snprintf(p50, sizeof p50, "%.1f", r.lib.p50);
      std::snprintf(p99, sizeof p99, "%.1f", r.lib.p99);
    }
    if (child_target) std::snprintf(cpu_t, sizeof cpu_t, "%.3f", r.lib.cpu_target);
    char raw_gbps[16] = "-", raw_cpu[16] = "-", ratio_text[16] = "-", gbps[16] = "-", mops[16] = "-", cpu_i[16] = "-";
    char sleeps[16] = "-", raw_sleeps[16] = "-";
    if (!r.raw_missing) {
      std::snprintf(raw_gbps, sizeof raw_gbps, "%.3f", r.raw.gbps);
      std::snprintf(raw_cpu, sizeof raw_cpu, "%.3f", r.raw.cpu_init);
      std::snprintf(raw_sleeps, sizeof raw_sleeps, "%.3f", r.raw.target_sleeps);
    }
    if (!r.library_missing) {
      std::snprintf(gbps, sizeof gbps, "%.3f", r.lib.gbps);
      std::snprintf(mops, sizeof mops, "%.4f", r.lib.mops);
      std::snprintf(cpu_i, sizeof cpu_i, "%.3f", r.lib.cpu_init);
      std::snprintf(sleeps, sizeof sleeps, "%.3f", r.lib.target_sleeps);
    }
    char interval[32] = "-";
    if (!r.raw_missing && !r.library_missing) {
      std::snprintf(ratio_text, sizeof ratio_text, "%.3f", ratio);
      if (r.ratio_high > 0) std::snprintf(interval, sizeof interval, "%.3f-%.3f", r.ratio_low, r.ratio_high);
    }
    if (r.library_missing || !child_target) cpu_t[0] = '\0';
    std::printf("%-9s %-5s %6s %5d %-8s %9s %9s %9s %9s %9s %9s %8s %9s %9s %8s %8s %12s%s\n", r.point.api.c_str(),
                direction_text(r.point.direction), size_text(r.point.size).c_str(), r.point.depth, r.point.wait.c_str(),
                gbps, mops, cpu_i, cpu_t, p50, p99, sleeps, raw_gbps, raw_cpu, raw_sleeps, ratio_text, interval,
                r.lib.errors != 0 ? "  ERRORS" : "");
  }
}

void print_json(const std::vector<Row>& rows) {
  std::printf("[\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    char interval[48] = "null";  // fewer than 6 pairs: no 95 % interval exists
    if (r.ratio_high > 0) std::snprintf(interval, sizeof interval, "[%.4f, %.4f]", r.ratio_low, r.ratio_high);
    std::printf(
        "  {\"api\": \"%s\", \"direction\": \"%s\", \"size\": %zu, \"depth\": %d, \"wait\": \"%s\", \"runs\": %d, "
        "\"gbps\": %.6f, \"mtransfers_per_s\": %.6f, \"cpu_initiator_s_per_gib\": %.6f, "
        "\"cpu_target_s_per_gib\": %.6f, \"target_sleeps_per_transfer\": %.4f, \"p50_us\": %.3f, "
        "\"p99_us\": %.3f, \"raw_gbps\": %.6f, \"raw_mtransfers_per_s\": %.6f, \"raw_p50_us\": %.3f, "
        "\"raw_cpu_initiator_s_per_gib\": %.6f, \"raw_cpu_target_s_per_gib\": %.6f, "
        "\"raw_target_sleeps_per_transfer\": %.4f, \"ratio\": %.4f, \"ratio_ci95\": %s, \"errors\": %llu}%s\n",
        r.point.api.c_str(), direction_text(r.point.direction), r.point.size, r.point.depth, r.point.wait.c_str(),
        r.runs, r.lib.gbps, r.lib.mops, r.lib.cpu_init, r.lib.cpu_target, r.lib.target_sleeps, r.lib.p50, r.lib.p99,
        r.raw.gbps, r.raw.mops, r.raw.p50, r.raw.cpu_init, r.raw.cpu_target, r.raw.target_sleeps, r.ratio, interval,
        static_cast<unsigned long long>(r.lib.errors), i + 1 < rows.size() ? "," : "");
  }
  std::printf("]\n");
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dma-bench: dma-libfabric against a plain libfabric loop over tcp on 127.0.0.1"};
  std::string sizes = "64,1K,4K,64K,1M,4M", directions = "write,read", depths = "1,16,64";
  std::string apis = "awaitable,callback", waits = "fd,adaptive,busy", bind = "127.0.0.1", target = "child",
              target_wait = "fd";
  int runs = 5;
  double spin_us = 50;
  double duration = 0.2;
  bool json = false, serve_mode = false, hugepages = false;
  std::size_t region = 0;
  std::string only, pin;
  int serve_cpu = -1;
  app.add_option("--sizes", sizes, "transfer sizes, comma-separated (K, M suffixes)")->capture_default_str();
  app.add_option("--directions", directions, "write, read")->capture_default_str();
  app.add_option("--depths", depths, "transfers in flight")->capture_default_str();
  app.add_option("--apis", apis,
                 "awaitable, handler (plain completion handler), callback; raw = a second raw loop on its own "
                 "endpoint, an A/A control of the harness (the raw baseline always runs alongside)")
      ->capture_default_str();
  app.add_option("--wait", waits, "fd, adaptive, busy")->capture_default_str();
  app.add_option("--runs", runs, "interleaved runs per point (medians are reported)")->capture_default_str();
  app.add_option("--duration", duration, "seconds per run")->capture_default_str();
  app.add_option("--spin-us", spin_us, "adaptive wait: microseconds to poll before arming the fd")
      ->capture_default_str();
  app.add_option("--target", target, "child or inprocess")->check(CLI::IsMember({"child", "inprocess"}));
  app.add_option("--bind", bind, "loopback address to use")->capture_default_str();
  app.add_option("--target-wait", target_wait,
                 "the target's wait mode: fd, adaptive, busy (a spinning target spares the writer the wake-ups "
                 "loopback charges to its sendmsg)")
      ->check(CLI::IsMember({"fd", "adaptive", "busy"}))
      ->capture_default_str();
  app.add_option("--only", only, "run one side alone, for profilers (no ratio; library also prints engine counters)")
      ->check(CLI::IsMember({"library", "raw"}));
  app.add_flag("--hugepages", hugepages, "back the initiator's buffers with transparent huge pages");
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_option("--pin", pin,
                 "I,T: run the initiator on CPU I and the target on CPU T (both sides of every pair alike), "
                 "which takes the scheduler's placement out of the comparison");
  app.add_option("--serve-cpu", serve_cpu, "internal: the target process's CPU");
  app.add_flag("--serve", serve_mode, "internal: run as the target process");
  app.add_option("--region", region, "internal: bytes the target exposes");
  CLI11_PARSE(app, argc, argv);

  try {
    // Named threads, so that profilers tell the two processes (and their threads) apart.
    prctl(PR_SET_NAME, serve_mode ? "bench-target" : "bench-initiator");
    if (serve_mode) return serve(bind, region, target_wait, serve_cpu);
    int initiator_cpu = -1, target_cpu = -1;
    if (!pin.empty()) {
      const auto cpus = split(pin);
      if (cpus.size() != 2) throw std::invalid_argument("--pin takes two CPUs, initiator,target: " + pin);
      auto cpu = [&](const std::string& text) {
        std::size_t end = 0;
        int value = -1;
        try {
          value = std::stoi(text, &end);
        } catch (const std::exception&) {
          end = 0;
        }
        if (end != text.size() || value < 0) throw std::invalid_argument("--pin: not a CPU number: " + text);
        return value;
      };
      initiator_cpu = cpu(cpus[0]);
      target_cpu = cpu(cpus[1]);
    }

    std::vector<std::size_t> size_list;
    for (const auto& s : split(sizes))
      size_list.push_back(parse_size(s));
    std::vector<int> depth_list;
    for (const auto& d : split(depths))
      depth_list.push_back(std::stoi(d));
    if (size_list.empty() || depth_list.empty())
      throw std::invalid_argument("nothing to measure: empty --sizes or --depths");
    const std::size_t max_size = *std::max_element(size_list.begin(), size_list.end());
    const int max_depth = *std::max_element(depth_list.begin(), depth_list.end());
    const std::size_t span = max_size * static_cast<std::size_t>(max_depth);

    std::unique_ptr<ChildTarget> child;
    std::unique_ptr<InProcessTarget> local_target;
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (target == "child") {
      child = std::make_unique<ChildTarget>(std::string(self, static_cast<std::size_t>(std::max<ssize_t>(n, 0))), bind,
                                            span, target_wait, target_cpu);
    } else {
      local_target = std::make_unique<InProcessTarget>(bind, span, target_wait, target_cpu);
    }
    pin_to(initiator_cpu);  // after the target started: its process or thread pins itself
    LocalBuffer local(span, hugepages);
    Setup setup{child ? child->advertisement() : local_target->advertisement(),
                std::chrono::nanoseconds(static_cast<std::int64_t>(spin_us * 1000)),
                bind,
                local.bytes(),
                duration,
                max_depth};
    Library library(setup);
    Raw raw(setup);
    std::unique_ptr<Raw> control;  // --apis raw: the baseline against itself

    std::vector<Point> points;
    for (const auto& d : split(directions)) {
      for (auto size : size_list) {
        for (int depth : depth_list) {
          for (const auto& w : split(waits)) {
            for (const auto& a : split(apis)) {
              if (a != "awaitable" && a != "handler" && a != "callback" && a != "raw") {
                throw std::invalid_argument("unknown API " + a + " (awaitable, handler, callback, raw)");
              }
              (void)wait_mode(w);  // an unknown wait mode fails here, before anything runs
              points.push_back({a, d == "read" ? dma::Direction::FromPeer : dma::Direction::ToPeer, size, depth, w});
            }
          }
        }
      }
    }

    if (points.empty()) throw std::invalid_argument("nothing to measure: empty --directions, --apis or --wait");
    std::fprintf(stderr, "environment: %s\n", environment_line(raw.provider(points.front().wait)).c_str());
    const bool progress = isatty(STDERR_FILENO) != 0;
    std::uint64_t library_total = 0, raw_total = 0;
    std::vector<Row> rows;
    for (std::size_t i = 0; i < points.size(); ++i) {
      const auto& point = points[i];
      if (progress) {
        std::fprintf(stderr, "\r[%zu/%zu] %s %s %s d%d %s      ", i + 1, points.size(), point.api.c_str(),
                     direction_text(point.direction), size_text(point.size).c_str(), point.depth, point.wait.c_str());
      }
      std::vector<Sample> library_samples, raw_samples;
      if (point.api == "raw" && !control) control = std::make_unique<Raw>(setup);
      if (point.api != "raw") library.prepare(point);
      // The measured side: the library through one API, or the A/A control.
      auto measured = [&] {
        if (point.api == "raw") return control->run(point);
        if (point.api == "callback") return library.callback(point);
        if (point.api == "handler") return library.handler(point);
        return library.awaitable(point);
      };
      {  // warm-up, discarded: connections, page faults, caches
        Setup& mutable_setup = setup;
        const double full = mutable_setup.duration;
        mutable_setup.duration = full / 4;
        if (only != "raw") library_total += measured().transfers;
        if (only != "library") raw_total += raw.run(point).transfers;
        mutable_setup.duration = full;
      }
      // getrusage of this process and of the child around each run (the in-process target's CPU
      // shows up in the initiator's).
      auto timed = [&](auto&& run) {
        auto target_usage = [&] { return child ? child->usage() : local_target->usage(); };
        const double cpu0 = cpu_seconds();
        const TargetUsage target0 = target_usage();
        Sample s = run();
        s.cpu_initiator = cpu_seconds() - cpu0;
        const TargetUsage target1 = target_usage();
        s.cpu_target = target1.cpu - target0.cpu;
        s.target_sleeps = target1.sleeps - target0.sleeps;
        return s;
      };
      auto run_library = [&] {
        if (only == "raw") return;
        library_samples.push_back(timed(measured));
        library_total += library_samples.back().transfers;
      };
      auto run_raw = [&] {
        if (only == "library") return;
        raw_samples.push_back(timed([&] { return raw.run(point); }));
        raw_total += raw_samples.back().transfers;
      };
      for (int r = 0; r < runs; ++r) {  // A B, B A, A B, ...: whichever goes second has no edge
        if (r % 2 == 0) {
          run_library();
          run_raw();
        } else {
          run_raw();
          run_library();
        }
      }
      rows.push_back(summarise(point, library_samples, raw_samples));
    }
    if (progress) std::fprintf(stderr, "\r%60s\r", "");
    // For instruction counts (valgrind --tool=callgrind --toggle-collect=...): divide by these.
    std::fprintf(stderr, "transfers run: library %llu, raw %llu\n", static_cast<unsigned long long>(library_total),
                 static_cast<unsigned long long>(raw_total));
    if (only == "library") library.print_metrics();
    if (json) {
      print_json(rows);
    } else {
      print_table(rows, child != nullptr);
    }
    std::uint64_t errors = 0;
    for (const auto& row : rows)
      errors += row.lib.errors;
    if (errors != 0) {  // a benchmark whose transfers failed measured nothing
      std::fprintf(stderr, "dma-bench: %llu transfers failed\n", static_cast<unsigned long long>(errors));
      return 2;
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dma-bench: %s\n", error.what());
    return 1;
  }
}
