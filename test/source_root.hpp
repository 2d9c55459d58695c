// The source tree, for tests that read the shipped config/ and test/ files: DMA_SOURCE_ROOT from
// the environment (meson test sets it). Taken at run time, not compile time, so that a test's
// object is the same from any checkout and a compiler cache shared by clones reuses it.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace test {

inline std::string source_root() {
  const char* root = std::getenv("DMA_SOURCE_ROOT");
  if (root == nullptr || *root == '\0') {
    throw std::runtime_error("DMA_SOURCE_ROOT is not set: run the tests with meson test, or set it to the source tree");
  }
  return root;
}

}  // namespace test
