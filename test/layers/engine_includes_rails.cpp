// An engine file that includes the coordinator of several endpoints, the layer above it. The
// engine layer's include directories hold lib/core/, lib/progress/, lib/registration/ and
// lib/engine/ (lib/meson.build), so this must not compile; with the rails layer's, it does (the
// control).
#include "ledger.hpp"
#include "poster.hpp"

#include "rails.hpp"
