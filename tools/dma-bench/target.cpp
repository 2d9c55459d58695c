#include "target.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <system_error>

namespace bench {
namespace {

constexpr auto answer_bound = std::chrono::seconds(60);

// The --config file's configuration (or the defaults), with the target's own bind and wait mode.
dma::Configuration target_configuration(const dma::Configuration& base, const std::string& bind, Wait wait) {
  dma::Configuration c = base;
  c.bind = bind;
  c.wait_mode = wait_mode(wait);
  return c;
}

// `dma-bench --serve ...`: the same file, and the options that override it given explicitly.
std::vector<std::string> child_arguments(const std::string& self, const std::string& config, const std::string& bind,
                                         std::size_t region_size, Wait wait, int cpu) {
  std::vector<std::string> arguments{self,
                                     "--serve",
                                     "--bind",
                                     bind,
                                     "--region",
                                     std::to_string(region_size),
                                     "--target-wait",
                                     std::string(to_string(wait)),
                                     "--serve-cpu",
                                     std::to_string(cpu)};
  if (!config.empty()) arguments.insert(arguments.end(), {"--config", config});
  return arguments;
}

}  // namespace

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

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

void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    throw std::system_error(errno, std::generic_category(), "sched_setaffinity to CPU " + std::to_string(cpu));
  }
}

int serve(const dma::Configuration& base, const std::string& bind, std::size_t region_size, Wait wait, int cpu) {
  pin_to(cpu);
  // The progress thread inherits the process's CPU.
  auto target = dma::TargetThread::start(target_configuration(base, bind, wait));
  std::vector<std::byte> region(region_size, std::byte{0x5a});
  auto exposed = target->expose(region);
  std::printf("advertisement: %s\n", exposed.advertisement().to_string().c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "usage") {
      std::printf("usage %.6f %" PRIu64 "\n", cpu_seconds(), voluntary_switches(target->thread_id()));
    }
    std::fflush(stdout);
  }
  return 0;
}

ChildTarget::ChildTarget(const std::string& self, const std::string& config, const std::string& bind,
                         std::size_t region_size, Wait wait, int cpu)
    : process_(child_arguments(self, config, bind, region_size, wait, cpu), true) {
  const std::string line = process_.line(answer_bound);
  const std::string prefix = "advertisement: ";
  if (line.rfind(prefix, 0) != 0) {
    throw std::runtime_error(line.empty() ? "the target process exited or said nothing"
                                          : "the target process printed: " + line);
  }
  advertisement_ = dma::Advertisement::parse(line.substr(prefix.size()));
}

ChildTarget::~ChildTarget() {
  process_.close_input();  // end of input: it closes its endpoint and exits
  if (process_.wait(std::chrono::seconds(5)) < 0) process_.kill_now();
}

TargetUsage ChildTarget::usage() {
  if (!process_.write_line("usage")) throw std::runtime_error("the target process is gone");
  const std::string line = process_.line(answer_bound);
  TargetUsage u;
  if (std::sscanf(line.c_str(), "usage %lf %" SCNu64, &u.cpu, &u.sleeps) != 2) {
    throw std::runtime_error(line.empty() ? "the target process did not answer" : "the target answered: " + line);
  }
  return u;
}

InProcessTarget::InProcessTarget(const dma::Configuration& base, const std::string& bind, std::size_t region_size,
                                 Wait wait, int cpu)
    : target_(dma::TargetThread::start(target_configuration(base, bind, wait), {cpu, "target"})),
      region_(region_size, std::byte{0x5a}) {
  exposed_ = target_->expose(region_);
}

}  // namespace bench
