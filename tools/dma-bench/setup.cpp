#include "setup.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace bench {

LocalBuffer::LocalBuffer(std::size_t size, bool huge) : size_(size) {
  constexpr std::size_t huge_page = std::size_t{2} << 20;
  mapped_ = huge ? size + huge_page : size;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap of the local buffer");
  base_ = static_cast<std::byte*>(p);
  data_ = base_;
  if (huge) {
    const auto address = reinterpret_cast<std::uintptr_t>(base_);
    data_ = base_ + ((huge_page - address % huge_page) % huge_page);
    if (madvise(data_, size, MADV_HUGEPAGE) != 0) std::perror("dma-bench: madvise(MADV_HUGEPAGE)");
  }
  std::memset(data_, 0xa5, size);
}

LocalBuffer::~LocalBuffer() { munmap(base_, mapped_); }

}  // namespace bench
