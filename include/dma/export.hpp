/// @file
/// DMA_EXPORT marks what the shared library exports. The library is built with hidden visibility,
/// so a program sees only the declarations marked with it: the public API, and the few entry
/// points the header templates call (docs/design.md, "What the library exports").
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define DMA_EXPORT __attribute__((visibility("default")))
#else
#define DMA_EXPORT
#endif
