// The child-process helper the tests share with the tools: started and ended by its PID.
#pragma once

#include "../tools/common/child_process.hpp"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace test {

using Child = dma::tools::ChildProcess;

/// A program built next to the test binary, or the path Meson passed in `variable`.
inline std::string sibling_program(const char* variable, const std::string& relative) {
  if (const char* path = std::getenv(variable)) return path;
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string("test/x");
  return dir.substr(0, dir.rfind('/')) + "/" + relative;
}

}  // namespace test
