#include "dma/version.hpp"

namespace dma {

std::string_view version() noexcept { return DMA_VERSION_STRING; }

}  // namespace dma
