// A Target file that includes the engine's failure handling. The target layer's include
// directories hold lib/core/, lib/progress/ and lib/target/ (lib/meson.build), so this must not
// compile; with the engine's, it does (the control).
#include "cq_watcher.hpp"
#include "notification_queue.hpp"

#include "completion_error.hpp"
