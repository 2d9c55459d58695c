// The library's efa-direct hints against a real efa provider (libfabric 2.x built with
// --enable-efa, CI's 2.6 build) on a machine without an EFA device: fi_getinfo reaches efa's
// getinfo, which answers with no entry, and fails for that reason alone. libfabric's own log
// (FI_LOG_LEVEL=info, captured from stderr) shows which provider said what. A process of its own:
// libfabric reads FI_LOG_LEVEL once. Exits 77 (skipped) where libfabric has no efa provider, or
// where an RDMA device exists (the answer would then depend on it).
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main
#include "../catch.hpp"
#include "dma/error.hpp"
#include "hints.hpp"

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#endif

#include <dirent.h>
#include <rdma/fabric.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string captured_log;  // libfabric's stderr while main set up and ran the query below

// Sends fd 2 to a scratch file until stop(), which returns what was written.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    file_ = std::tmpfile();
    dup2(fileno(file_), STDERR_FILENO);
  }
  ~StderrCapture() { stop(); }
  std::string stop() {
    if (saved_ < 0) return {};
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(std::exchange(saved_, -1));
    std::rewind(file_);
    std::string text;
    char chunk[4096];
    for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, file_)) > 0;)
      text.append(chunk, n);
    std::fclose(file_);
    return text;
  }

 private:
  int saved_ = -1;
  std::FILE* file_ = nullptr;
};

bool efa_is_built() {
  fi_info* providers = nullptr;
  if (fi_getinfo(fi_version(), nullptr, nullptr, FI_PROV_ATTR_ONLY, nullptr, &providers) != 0) return false;
  bool found = false;
  for (const fi_info* p = providers; p != nullptr; p = p->next)
    found = found || (p->fabric_attr && p->fabric_attr->prov_name && std::string(p->fabric_attr->prov_name) == "efa");
  fi_freeinfo(providers);
  return found;
}

bool rdma_device_present() {
  DIR* dir = opendir("/sys/class/infiniband");
  if (dir == nullptr) return false;
  bool any = false;
  while (const dirent* entry = readdir(dir))
    any = any || entry->d_name[0] != '.';
  closedir(dir);
  return any;
}

bool logged(const std::string& line) { return captured_log.find(line) != std::string::npos; }

dma::Configuration efa_direct() {
  dma::Configuration configuration;
  configuration.providers = {dma::Provider::efa_direct};
  return configuration;
}

std::error_code query_ec;
std::string query_what;

}  // namespace

TEST_CASE("fi_getinfo with the library's efa-direct hints reaches efa's getinfo and fails only for want of a device",
          "[efa]") {
  INFO("fi_getinfo: " << query_what << "\nlibfabric's log:\n" << captured_log);
  CHECK(query_ec == dma::errc::no_provider);
  CHECK(query_what.find("No data available") != std::string::npos);  // -FI_ENODATA
  CHECK(logged("registering provider: efa"));
  // efa's getinfo ran and returned success with an empty list (no device, so no entry to match);
  // a refusal of the hints would log "provider efa returned -N" instead.
  CHECK(logged("fi_getinfo: provider efa output empty list"));
  CHECK(!logged("fi_getinfo: provider efa returned"));
}

int main(int argc, char* argv[]) {
  // Before libfabric's first call: it reads the level once, when it initialises.
  setenv("FI_LOG_LEVEL", "info", 1);
  StderrCapture capture;
  const std::uint32_t version = fi_version();
  if (FI_MAJOR(version) < 2 || (FI_MAJOR(version) == 2 && FI_MINOR(version) < 1)) {
    capture.stop();
    std::printf("libfabric %u.%u has no efa-direct (2.1 and later have); skipped\n", FI_MAJOR(version),
                FI_MINOR(version));
    return 77;
  }
  if (!efa_is_built()) {
    capture.stop();
    std::printf("this libfabric has no efa provider (configure --enable-efa, with libibverbs-dev); skipped\n");
    return 77;
  }
  if (rdma_device_present()) {
    capture.stop();
    std::printf("an RDMA device is present (/sys/class/infiniband): the answer depends on it; skipped\n");
    return 77;
  }
  dma::detail::query_info(efa_direct(), query_ec, query_what);
  captured_log = capture.stop();
  return Catch::Session().run(argc, argv);
}
