// A unit that includes Asio before anything else, as a user's may. Asio's configuration then runs
// before any standard header has said whether aligned_alloc exists (_GLIBCXX_HAVE_ALIGNED_ALLOC),
// and would allocate its handlers with operator new here while the library's units use
// aligned_alloc, from the same per-thread recycled blocks. The library's public compile arguments
// (its Meson dependency, pkg-config and CMake package) tell Asio what the library's build found.
#include <asio/io_context.hpp>

#include <dma/dma.hpp>

#if defined(_GLIBCXX_HAVE_ALIGNED_ALLOC) && !defined(ASIO_HAS_STD_ALIGNED_ALLOC)
#error "Asio, included first, allocates its handlers with operator new; the library uses aligned_alloc"
#endif
