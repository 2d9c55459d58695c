#include "random_key.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace dma::detail {

std::error_code fill_random(std::span<std::byte> out) noexcept {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::getrandom(out.data() + done, out.size() - done, 0);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return std::make_error_code(std::errc::io_error);  // never seen; retrying could spin forever
    } else if (errno != EINTR) {
      return {errno, std::system_category()};
    }
  }
  return {};
}

std::uint64_t random_key(std::error_code& ec) noexcept {
  std::byte bytes[sizeof(std::uint64_t)];
  ec = fill_random(bytes);
  if (ec) return 0;
  std::uint64_t key = 0;
  std::memcpy(&key, bytes, sizeof key);
  return key;
}

}  // namespace dma::detail
