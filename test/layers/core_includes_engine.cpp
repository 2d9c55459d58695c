// A core file that includes an engine header. The core layer's include directories hold only
// lib/core/ (lib/meson.build), so this must not compile; with the engine's, it does (the control).
#include "log.hpp"

#include "ledger.hpp"
