#include "dma/memory_region.hpp"
#include "region_cache.hpp"

namespace dma {

void invalidate(std::uintptr_t start, std::uintptr_t end) noexcept {
  detail::RegionCache::instance().invalidate(start, end);
}

}  // namespace dma
