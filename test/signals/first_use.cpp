// The library loads libfabric at its first call into it, and the program's signal handlers survive
// that load: installs handlers for SIGINT, SIGTERM, SIGSEGV and SIGABRT, checks that linking the
// library loaded no libfabric, calls into libfabric through the library, and checks that
// libfabric is loaded now and every disposition is as it was. Prints which objects with a
// constructor of their own the load brought in (Debian 12's libfabric: libinfinipath, which
// installs handlers of its own).
#include <dma/dma.hpp>

#include <link.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

void handler(int) {}

std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        static_cast<std::vector<std::string>*>(out)->emplace_back(info->dlpi_name);
        return 0;
      },
      &names);
  return names;
}

// Whether an object whose file name starts with `prefix` is loaded.
bool loaded(const char* prefix) {
  for (const auto& path : loaded_objects())
    if (path.compare(path.rfind('/') + 1, std::strlen(prefix), prefix) == 0) return true;
  return false;
}

void* handler_of(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(a.sa_sigaction)
                                        : reinterpret_cast<void*>(a.sa_handler);
}

}  // namespace

int main() {
  struct sigaction mine {};
  mine.sa_handler = handler;
  sigemptyset(&mine.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGSEGV, SIGABRT})
    sigaction(s, &mine, nullptr);
  static struct sigaction before[NSIG];
  static bool known[NSIG];
  for (int s = 1; s < NSIG; ++s)
    known[s] = sigaction(s, nullptr, &before[s]) == 0;

  dma::set_log_handler(dma::log_to_stderr(dma::LogLevel::info));  // which signals the load put back
  if (loaded("libfabric.so")) {
    std::printf("FAIL: libfabric was loaded before the library's first call into it\n");
    return 1;
  }
  const std::string version = dma::fabric_version();
  if (!loaded("libfabric.so")) {
    std::printf("FAIL: libfabric is not loaded after dma::fabric_version() (%s)\n", version.c_str());
    return 1;
  }
  std::printf("libfabric %s loaded at first use%s\n", version.c_str(),
              loaded("libinfinipath") ? ", with libinfinipath" : "");
  int changed = 0;
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction now {};
    if (!known[s] || sigaction(s, nullptr, &now) != 0) continue;
    // SA_RESTORER (0x04000000) reads back on any disposition the C library set, put back ones too.
    if (handler_of(now) == handler_of(before[s]) && ((now.sa_flags ^ before[s].sa_flags) & ~0x04000000) == 0) continue;
    std::printf("FAIL: the handler of signal %d (%s) changed\n", s, strsignal(s));
    ++changed;
  }
  if (changed == 0) std::printf("every signal disposition kept\n");
  return changed == 0 ? 0 : 1;
}
