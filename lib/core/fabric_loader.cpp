#include "fabric_loader.hpp"

#include "log.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <dlfcn.h>
#include <link.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>

namespace dma::detail {

namespace {

// The soname the library was built against: what the dynamic linker would have looked up for a
// DT_NEEDED entry, found the same way (the library's own run path first, then the system's).
constexpr const char* fabric_soname = "libfabric.so.1";

// libfabric's entry points the library calls, as the headers it is compiled against declare them.
struct Calls {
  decltype(&::fi_getinfo) getinfo = nullptr;
  decltype(&::fi_freeinfo) freeinfo = nullptr;
  decltype(&::fi_dupinfo) dupinfo = nullptr;
  decltype(&::fi_fabric) fabric = nullptr;
  decltype(&::fi_version) version = nullptr;
  decltype(&::fi_strerror) strerror = nullptr;
  decltype(&::fi_tostr) tostr = nullptr;
  decltype(&::fi_tostr_r) tostr_r = nullptr;
};

Calls calls;
FabricLoad outcome;
std::once_flag once;

// The load bias of every object loaded now: an object loaded later has another one.
std::vector<std::uintptr_t> loaded_objects() {
  std::vector<std::uintptr_t> biases;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        static_cast<std::vector<std::uintptr_t>*>(out)->push_back(info->dlpi_addr);
        return 0;
      },
      &biases);
  std::sort(biases.begin(), biases.end());
  return biases;
}

void* handler_of(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(action.sa_sigaction)
                                             : reinterpret_cast<void*>(action.sa_handler);
}

// The kernel reports SA_RESTORER on every disposition the C library set (it adds the flag
// itself), and not on one never set: a disposition put back reads back with it.
constexpr int restorer_flag = 0x04000000;

bool same_disposition(const struct sigaction& a, const struct sigaction& b) {
  return handler_of(a) == handler_of(b) && (a.sa_flags & ~restorer_flag) == (b.sa_flags & ~restorer_flag);
}

// Whether a disposition installed while libfabric loaded came from that load: its handler lies in
// an object the load brought in, or it is SIG_DFL/SIG_IGN (a constructor resetting a signal). A
// handler in an object loaded before was installed by another thread meanwhile: it stays.
bool installed_by_load(const struct sigaction& now, const std::vector<std::uintptr_t>& before) {
  void* handler = handler_of(now);
  if (handler == reinterpret_cast<void*>(SIG_DFL) || handler == reinterpret_cast<void*>(SIG_IGN)) return true;
  Dl_info info{};
  link_map* object = nullptr;
  if (dladdr1(handler, &info, reinterpret_cast<void**>(&object), RTLD_DL_LINKMAP) == 0 || object == nullptr) {
    return false;
  }
  return !std::binary_search(before.begin(), before.end(), static_cast<std::uintptr_t>(object->l_addr));
}

template <typename F>
bool bind(void* handle, const char* name, F& function) {
  function = reinterpret_cast<F>(dlsym(handle, name));
  return function != nullptr;
}

void load() noexcept {
  try {
    std::array<struct sigaction, NSIG> before{};
    std::array<bool, NSIG> known{};
    for (int signal = 1; signal < NSIG; ++signal)
      known[signal] = sigaction(signal, nullptr, &before[signal]) == 0;
    const std::vector<std::uintptr_t> objects = loaded_objects();

    void* handle = dlopen(fabric_soname, RTLD_NOW | RTLD_LOCAL);

    for (int signal = 1; signal < NSIG; ++signal) {
      struct sigaction now {};
      if (!known[signal] || sigaction(signal, nullptr, &now) != 0 || same_disposition(now, before[signal])) continue;
      if (!installed_by_load(now, objects)) continue;
      if (sigaction(signal, &before[signal], nullptr) == 0) outcome.restored_signals.push_back(signal);
    }
    if (handle == nullptr) {
      const char* why = dlerror();
      outcome.error = std::string(fabric_soname) + ": " + (why != nullptr ? why : "cannot be loaded");
    } else if (!bind(handle, "fi_getinfo", calls.getinfo) || !bind(handle, "fi_freeinfo", calls.freeinfo) ||
               !bind(handle, "fi_dupinfo", calls.dupinfo) || !bind(handle, "fi_fabric", calls.fabric) ||
               !bind(handle, "fi_version", calls.version) || !bind(handle, "fi_strerror", calls.strerror) ||
               !bind(handle, "fi_tostr", calls.tostr) || !bind(handle, "fi_tostr_r", calls.tostr_r)) {
      calls = Calls{};
      outcome.error = std::string(fabric_soname) + " lacks an entry point the library calls";
    } else {
      outcome.loaded = true;
    }
  } catch (...) {  // out of memory while listing: libfabric stays unloaded
    calls = Calls{};
    outcome.loaded = false;
  }
  if (!outcome.restored_signals.empty() && process_log_enabled(LogLevel::info)) {
    std::string text = "loading libfabric changed the handlers of signals";
    for (int signal : outcome.restored_signals)
      text += ' ' + std::to_string(signal);
    process_log(LogLevel::info, text + "; they are back as they were");
  }
  if (!outcome.loaded && process_log_enabled(LogLevel::error)) process_log(LogLevel::error, outcome.error);
}

const Calls* fabric() noexcept {
  std::call_once(once, load);
  return outcome.loaded ? &calls : nullptr;
}

}  // namespace

const FabricLoad& load_fabric() noexcept {
  (void)fabric();
  return outcome;
}

}  // namespace dma::detail

// The library's calls to libfabric land here (hidden: no program or library sees these), and go on
// to the loaded libfabric. Without one, every call fails as a provider that supports nothing would.
extern "C" {

int fi_getinfo(uint32_t version, const char* node, const char* service, uint64_t flags, const struct fi_info* hints,
               struct fi_info** info) {
  const auto* f = dma::detail::fabric();
  return f != nullptr ? f->getinfo(version, node, service, flags, hints, info) : -FI_ENOSYS;
}

void fi_freeinfo(struct fi_info* info) {
  if (const auto* f = dma::detail::fabric()) f->freeinfo(info);
}

struct fi_info* fi_dupinfo(const struct fi_info* info) {
  const auto* f = dma::detail::fabric();
  return f != nullptr ? f->dupinfo(info) : nullptr;
}

int fi_fabric(struct fi_fabric_attr* attr, struct fid_fabric** fabric, void* context) {
  const auto* f = dma::detail::fabric();
  return f != nullptr ? f->fabric(attr, fabric, context) : -FI_ENOSYS;
}

uint32_t fi_version(void) {
  const auto* f = dma::detail::fabric();
  return f != nullptr ? f->version() : 0;
}

const char* fi_strerror(int errnum) {
  if (const auto* f = dma::detail::fabric()) return f->strerror(errnum);
  return dma::detail::load_fabric().error.c_str();
}

char* fi_tostr(const void* data, enum fi_type datatype) {
  const auto* f = dma::detail::fabric();
  return f != nullptr ? f->tostr(data, datatype) : nullptr;
}

char* fi_tostr_r(char* buf, size_t len, const void* data, enum fi_type datatype) {
  if (const auto* f = dma::detail::fabric()) return f->tostr_r(buf, len, data, datatype);
  if (buf != nullptr && len != 0) buf[0] = '\0';
  return buf;
}

}  // extern "C"
