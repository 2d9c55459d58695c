// The header tests' main, and the proof that no libfabric macro reaches a user: libfabric's
// fabric.h defines count_of and container_of as macros, which would turn the calls below into
// something else had <dma/dma.hpp> brought it in.
int count_of(int n);
int container_of(int n);

#include <dma/dma.hpp>

#if defined(count_of) || defined(container_of) || defined(FI_MAJOR_VERSION)
#error "a libfabric header reached a user's translation unit through <dma/dma.hpp>"
#endif

int count_of(int n) { return n; }
int container_of(int n) { return n + 1; }

int main() { return count_of(1) + container_of(-2); }
