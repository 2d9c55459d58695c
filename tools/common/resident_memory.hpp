// Resident memory of a process, from /proc/<pid>/status (VmRSS), for the footprint tool and tests.
#pragma once

#include <malloc.h>
#include <sys/types.h>

#include <cstddef>
#include <fstream>
#include <string>

namespace dma::tools {

/// VmRSS of the process in bytes; 0 when it cannot be read (the process is gone).
inline std::size_t resident_bytes(pid_t pid = 0) {
  std::ifstream status(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      std::size_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 16, '\n');
  }
  return 0;
}

/// This process's VmRSS after handing freed heap back to the system, so that what a measurement
/// freed is not counted.
inline std::size_t trimmed_resident_bytes() {
  (void)malloc_trim(0);
  return resident_bytes();
}

}  // namespace dma::tools
