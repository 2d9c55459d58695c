// dma-bench's target: the passive peer the initiator writes into and reads from, either a child
// process (`dma-bench --serve`, the default) or a thread of this process (--target inprocess).
#pragma once

#include "../common/child_process.hpp"
#include "types.hpp"

#include <dma/dma.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace bench {

/// CPU seconds (user + system) of this process so far.
double cpu_seconds();

/// How often thread `tid` of this process went to sleep (its voluntary context switches): for the
/// target's progress thread, each one is a wake-up that a writer over loopback pays in its sendmsg.
std::uint64_t voluntary_switches(pid_t tid);

/// Binds the calling thread, and every thread it starts afterwards, to one CPU (-1: leave as is).
void pin_to(int cpu);

/// `--serve`: expose a region, print its advertisement, answer "usage" with this process's CPU
/// time and how often its progress thread slept, exit on end of input.
int serve(const dma::Configuration& base, const std::string& bind, std::size_t region_size, Wait wait, int cpu);

struct TargetUsage {
  double cpu = 0;            ///< CPU seconds of the target process (0 in process: the initiator's has it)
  std::uint64_t sleeps = 0;  ///< voluntary context switches of its progress thread
};

class Target {
 public:
  virtual ~Target() = default;
  virtual const dma::Advertisement& advertisement() const = 0;
  virtual TargetUsage usage() = 0;
  virtual bool is_child() const = 0;
};

/// The target as a child process in its own process group, spoken to over pipes.
class ChildTarget final : public Target {
 public:
  ChildTarget(const std::string& self, const std::string& config, const std::string& bind, std::size_t region_size,
              Wait wait, int cpu);
  ~ChildTarget() override;
  const dma::Advertisement& advertisement() const override { return advertisement_; }
  TargetUsage usage() override;
  bool is_child() const override { return true; }

 private:
  dma::tools::ChildProcess process_;
  dma::Advertisement advertisement_;
};

/// The target on a thread of this process (its CPU then shows up in the initiator's).
class InProcessTarget final : public Target {
 public:
  InProcessTarget(const dma::Configuration& base, const std::string& bind, std::size_t region_size, Wait wait, int cpu);
  const dma::Advertisement& advertisement() const override { return exposed_.advertisement(); }
  TargetUsage usage() override { return {0, voluntary_switches(target_->thread_id())}; }
  bool is_child() const override { return false; }

 private:
  std::unique_ptr<dma::TargetThread> target_;
  std::vector<std::byte> region_;
  dma::Target::Region exposed_;
};

}  // namespace bench
