// What zeroed value storage costs dma-kv-server: allocate, fill (as a transfer does) and free one
// value, with 16 values alive so the allocator reuses freed ones as in the server, by malloc
// (uninitialised) and by calloc (zeroed). Best of 5 runs per size. docs/notes/hostile-clients.md.
//   value-zeroing-cost [bytes ...]      (default: 4096 4194304)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double microseconds_per_value(std::size_t size, bool zeroed) {
  const int count = static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 30) / size, 100, 200000));
  std::vector<void*> alive(16, nullptr);
  double best = 1e300;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < count; ++i) {
      void*& slot = alive[static_cast<std::size_t>(i) % alive.size()];
      std::free(slot);
      slot = zeroed ? std::calloc(size, 1) : std::malloc(size);
      if (slot == nullptr) return -1;
      std::memset(slot, 1, size);  // the transfer writes every byte
    }
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / count);
  }
  for (void* p : alive)
    std::free(p);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i)
    sizes.push_back(std::stoull(argv[i]));
  if (sizes.empty()) sizes = {4096, std::size_t{4} << 20};
  std::printf("%12s %12s %12s %12s\n", "bytes", "malloc_us", "calloc_us", "added_us");
  for (const auto size : sizes) {
    const double plain = microseconds_per_value(size, false);
    const double zeroed = microseconds_per_value(size, true);
    std::printf("%12zu %12.2f %12.2f %12.2f\n", size, plain, zeroed, zeroed - plain);
  }
}
