// Loading libfabric on first use, without letting it take over the process's signals.
//
// The library does not link libfabric: loading the library (linked, dlopen()ed, or inside a server
// module) loads no libfabric and runs none of its dependencies' constructors. The first call into
// libfabric dlopen()s `libfabric.so.1` once, and every signal disposition that an object loaded by
// that dlopen() installed is put back as it was. Debian 12's libfabric 1.17 needs it: its built-in
// psm provider links libpsm_infinipath, whose libinfinipath constructor installs handlers for
// SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT (its SIGTERM handler calls exit(1)), in
// whatever process loads it (docs/notes/signals.md).
//
// The library's own calls to libfabric's exported functions (fi_getinfo, fi_fabric, …) bind to
// hidden definitions in fabric_loader.cpp that load libfabric and forward; everything else in
// libfabric is reached through the function tables of the objects those return.
#pragma once

#include <string>
#include <vector>

namespace dma::detail {

/// What loading libfabric did. Loads it if it is not loaded yet (thread-safe, once).
struct FabricLoad {
  bool loaded = false;
  std::string error;                  ///< dlerror() when it could not be loaded
  std::vector<int> restored_signals;  ///< signals whose disposition the load changed and was put back
};
const FabricLoad& load_fabric() noexcept;

}  // namespace dma::detail
