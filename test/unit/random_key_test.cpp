// Remote keys from the OS's random source: one Target's keys say nothing about another's.
#include "random_key.hpp"
#include "../catch.hpp"

#include <bit>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

namespace {

// `count` keys drawn on a thread of their own, as a Target on its own executor would draw them.
std::vector<std::uint64_t> keys_of_one_target(std::size_t count) {
  std::vector<std::uint64_t> keys;
  std::error_code failed;
  std::thread([&] {
    for (std::size_t i = 0; i < count && !failed; ++i)
      keys.push_back(dma::detail::random_key(failed));
  }).join();
  REQUIRE_FALSE(failed);
  return keys;
}

}  // namespace

TEST_CASE("two targets' keys are unrelated: no repeats, no shared step, balanced bits", "[unit][keys]") {
  constexpr std::size_t count = 4096;
  const auto a = keys_of_one_target(count);
  const auto b = keys_of_one_target(count);

  std::set<std::uint64_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  CHECK(all.size() == 2 * count);

  // Related generators show up as repeated differences or xors between paired keys, or as one
  // target's step between consecutive keys reappearing in the other's. For independent 64-bit
  // values a single repeat among 4096 has a probability of about 2^-40.
  std::set<std::uint64_t> xors, differences, steps;
  for (std::size_t i = 0; i < count; ++i) {
    xors.insert(a[i] ^ b[i]);
    differences.insert(a[i] - b[i]);
  }
  for (std::size_t i = 0; i + 1 < count; ++i) {
    steps.insert(a[i + 1] - a[i]);
    steps.insert(b[i + 1] - b[i]);
  }
  CHECK(xors.size() == count);
  CHECK(differences.size() == count);
  CHECK(steps.size() == 2 * (count - 1));

  // Every bit is set in about half of the keys: 8192 draws give a standard deviation of 45, so
  // the 40–60 % band is 18 of them wide on each side.
  for (int bit = 0; bit < 64; ++bit) {
    std::size_t set = 0;
    for (const auto& keys : {a, b})
      for (const std::uint64_t key : keys)
        set += (key >> bit) & 1U;
    CAPTURE(bit);
    CHECK(set > 2 * count * 4 / 10);
    CHECK(set < 2 * count * 6 / 10);
  }
  // And about half of all bits of a key (popcount 32 on average, 4 standard deviations each way).
  std::size_t ones = 0;
  for (const std::uint64_t key : a)
    ones += static_cast<std::size_t>(std::popcount(key));
  CHECK(ones > count * 31);
  CHECK(ones < count * 33);
}

TEST_CASE("fill_random fills a buffer larger than one getrandom call may return", "[unit][keys]") {
  std::vector<std::byte> bytes(1 << 20, std::byte{0});
  REQUIRE_FALSE(dma::detail::fill_random(bytes));
  std::size_t zeros = 0;
  for (const std::byte b : bytes)
    zeros += b == std::byte{0} ? 1 : 0;
  CHECK(zeros < bytes.size() / 128);  // 1/256 expected: a short read would leave a run of zeros
}
