// Which sanitizer a test runs under: memory bounds do not hold under AddressSanitizer, and time
// bounds stretch 20-fold under either sanitizer.
#pragma once

namespace test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool address_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool address_sanitizer = true;
#else
inline constexpr bool address_sanitizer = false;
#endif
#else
inline constexpr bool address_sanitizer = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool thread_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool thread_sanitizer = true;
#else
inline constexpr bool thread_sanitizer = false;
#endif
#else
inline constexpr bool thread_sanitizer = false;
#endif

/// Under AddressSanitizer or ThreadSanitizer.
inline constexpr bool sanitized = address_sanitizer || thread_sanitizer;

}  // namespace test
