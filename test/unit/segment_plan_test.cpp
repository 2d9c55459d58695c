// The segment planner against a byte-map oracle: every byte of the local buffers, taken in order,
// must land on the byte of the remote segments at the same position, once, in posts that keep the
// provider's limits.
#include "segment_plan.hpp"
#include "../catch.hpp"

#include <dma/checksum.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

using dma::detail::LocalSegment;
using dma::detail::RemoteSegment;
using dma::detail::SegmentCursor;
using dma::detail::SegmentLimits;
using dma::detail::SegmentPlan;
using dma::detail::SegmentPost;
using dma::detail::ShapeError;

namespace {

struct Shape {
  std::vector<LocalSegment> local;
  std::vector<RemoteSegment> remote;
};

struct Walk {
  std::size_t posts = 0;
  std::string problem;  // empty when every check held
};

// Local bytes are identified by address, remote bytes by (address, key); the oracle maps the k-th
// byte of the local concatenation to the k-th of the remote one.
Walk walk(const Shape& shape, SegmentLimits limits) {
  ShapeError error = ShapeError::lengths_differ;
  const SegmentPlan plan = SegmentPlan::make(shape.local, shape.remote, limits, error);
  if (error != ShapeError::none) return {0, "refused: " + describe(error, shape.local, shape.remote, limits)};
  std::map<std::uintptr_t, std::size_t> local_starts;  // address of a piece -> (position, length)
  std::map<std::uint64_t, std::pair<std::size_t, std::uint64_t>> remote_starts;
  std::size_t position = 0;
  for (const LocalSegment& s : shape.local) {
    if (s.length != 0) local_starts[reinterpret_cast<std::uintptr_t>(s.base)] = position;
    position += s.length;
  }
  const std::size_t total = position;
  position = 0;
  for (const RemoteSegment& s : shape.remote) {
    if (s.length != 0) remote_starts[s.address] = {position, s.key};
    position += s.length;
  }
  auto local_position = [&](std::uintptr_t address) {
    auto it = std::prev(local_starts.upper_bound(address));
    return it->second + (address - it->first);
  };
  auto remote_position = [&](std::uint64_t address, std::uint64_t key, bool& key_ok) {
    auto it = std::prev(remote_starts.upper_bound(address));
    key_ok = it->second.second == key;
    return it->second.first + (address - it->first);
  };
  const std::size_t iov_limit = std::min(limits.iov_limit, SegmentPost::capacity);
  const std::size_t rma_limit = std::min(limits.rma_iov_limit, SegmentPost::capacity);
  std::vector<unsigned char> landed(total, 0);
  SegmentPost post;
  SegmentCursor at;
  Walk result;
  while (!plan.finished(at)) {
    if (result.posts > total + 1) return {result.posts, "the plan does not end"};
    const SegmentCursor next = plan.fill(at, post);
    ++result.posts;
    const std::string where = "post " + std::to_string(result.posts) + ": ";
    if (post.offset != at.done) return {result.posts, where + "offset " + std::to_string(post.offset)};
    if (post.iov_count == 0 || post.iov_count > iov_limit) return {result.posts, where + "iov count"};
    if (post.rma_count == 0 || post.rma_count > rma_limit) return {result.posts, where + "rma count"};
    if (post.bytes > limits.max_bytes) return {result.posts, where + "over max_bytes"};
    if (total != 0 && post.bytes == 0) return {result.posts, where + "moves nothing"};
    const std::size_t budget = std::min(limits.max_bytes, total - at.done);
    if (post.bytes != budget && post.iov_count != iov_limit && post.rma_count != rma_limit)
      return {result.posts, where + "stops short of every limit"};
    std::size_t local_sum = 0;
    std::size_t remote_sum = 0;
    std::vector<std::size_t> from;  // local positions of this post's bytes, in order
    for (std::size_t i = 0; i < post.iov_count; ++i) {
      if (total != 0 && post.iov[i].iov_len == 0) return {result.posts, where + "an empty iov entry"};
      local_sum += post.iov[i].iov_len;
      for (std::size_t b = 0; b < post.iov[i].iov_len; ++b)
        from.push_back(local_position(reinterpret_cast<std::uintptr_t>(post.iov[i].iov_base) + b));
    }
    std::size_t k = 0;
    for (std::size_t i = 0; i < post.rma_count; ++i) {
      if (total != 0 && post.rma[i].len == 0) return {result.posts, where + "an empty rma entry"};
      remote_sum += post.rma[i].len;
      for (std::size_t b = 0; b < post.rma[i].len && k < from.size(); ++b, ++k) {
        bool key_ok = false;
        const std::size_t to = remote_position(post.rma[i].addr + b, post.rma[i].key, key_ok);
        if (!key_ok) return {result.posts, where + "wrong key"};
        if (to != from[k]) return {result.posts, where + "byte lands at the wrong place"};
        if (landed[to]++ != 0) return {result.posts, where + "byte moved twice"};
      }
    }
    if (local_sum != post.bytes || remote_sum != post.bytes) return {result.posts, where + "sides differ"};
    at = next;
  }
  if (at.done != total) return {result.posts, "planned " + std::to_string(at.done) + " of " + std::to_string(total)};
  if (std::count(landed.begin(), landed.end(), 1) != static_cast<std::ptrdiff_t>(total))
    return {result.posts, "a byte never moved"};
  if (plan.count_posts() != result.posts) return {result.posts, "count_posts() disagrees"};
  return result;
}

// Buffers carved out of `memory` in order, with gaps, some of them empty.
std::vector<LocalSegment> carve_local(std::vector<std::byte>& memory, const std::vector<std::size_t>& lengths,
                                      std::mt19937_64& random) {
  std::vector<LocalSegment> local;
  std::size_t at = 0;
  for (std::size_t length : lengths) {
    at += random() % 3;
    local.push_back({memory.data() + at, length, reinterpret_cast<void*>(local.size() + 1)});
    at += length;
  }
  return local;
}

std::vector<RemoteSegment> carve_remote(const std::vector<std::size_t>& lengths, std::mt19937_64& random) {
  std::vector<RemoteSegment> remote;
  std::uint64_t at = 4096;
  for (std::size_t length : lengths) {
    at += random() % 5;
    remote.push_back({at, length, 1000 + remote.size() % 3});
    at += length;
  }
  return remote;
}

// `total` split into `parts` random lengths (some possibly 0).
std::vector<std::size_t> split(std::size_t total, std::size_t parts, std::mt19937_64& random) {
  std::vector<std::size_t> cuts{0, total};
  for (std::size_t i = 1; i < parts; ++i)
    cuts.push_back(total == 0 ? 0 : random() % (total + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::size_t> lengths;
  for (std::size_t i = 1; i < cuts.size(); ++i)
    lengths.push_back(cuts[i] - cuts[i - 1]);
  return lengths;
}

LocalSegment fake_local(std::uintptr_t address, std::size_t length) {
  return {reinterpret_cast<std::byte*>(address), length, nullptr};
}

}  // namespace

TEST_CASE("random shapes land byte-exact within the limits", "[segment_plan]") {
  std::mt19937_64 random(18);
  std::vector<std::byte> memory(8192);
  for (int round = 0; round < 3000; ++round) {
    const std::size_t total = round % 10 == 0 ? random() % 4 : random() % 3000;
    Shape shape;
    shape.local = carve_local(memory, split(total, 1 + random() % 9, random), random);
    shape.remote = carve_remote(split(total, 1 + random() % 9, random), random);
    const SegmentLimits limits{1 + random() % (total + 2), 1 + random() % 5, 1 + random() % 5};
    const Walk result = walk(shape, limits);
    INFO("round " << round << ", " << total << " bytes, " << shape.local.size() << " local, " << shape.remote.size()
                  << " remote, max " << limits.max_bytes << ", iov " << limits.iov_limit << ", rma "
                  << limits.rma_iov_limit);
    REQUIRE(result.problem == "");
  }
}

TEST_CASE("a 64 MiB transfer in 1 MiB segments is 64 posts of 1 MiB in order", "[segment_plan]") {
  constexpr std::size_t mib = std::size_t{1} << 20;
  const LocalSegment local[] = {fake_local(0x10000000, 64 * mib)};
  const RemoteSegment remote[] = {{0, 64 * mib, 7}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make(local, remote, {mib, 4, 4}, error);
  REQUIRE(error == ShapeError::none);
  SegmentPost post;
  SegmentCursor at;
  for (std::size_t i = 0; i < 64; ++i) {
    REQUIRE_FALSE(plan.finished(at));
    at = plan.fill(at, post);
    REQUIRE(post.bytes == mib);
    REQUIRE(post.offset == i * mib);
    REQUIRE(post.iov_count == 1);
    REQUIRE(reinterpret_cast<std::uintptr_t>(post.iov[0].iov_base) == 0x10000000 + i * mib);
    REQUIRE(post.rma_count == 1);
    REQUIRE(post.rma[0].addr == i * mib);
    REQUIRE(post.rma[0].key == 7);
  }
  REQUIRE(plan.finished(at));
  REQUIRE(at.done == 64 * mib);
}

TEST_CASE("a transfer that is not a multiple of the segment ends with a short post", "[segment_plan]") {
  const LocalSegment local[] = {fake_local(0x1000, 2500)};
  const RemoteSegment remote[] = {{0, 2500, 1}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make(local, remote, {1000, 4, 4}, error);
  SegmentPost post;
  SegmentCursor at;
  std::vector<std::size_t> sizes;
  while (!plan.finished(at)) {
    at = plan.fill(at, post);
    sizes.push_back(post.bytes);
  }
  REQUIRE(sizes == std::vector<std::size_t>{1000, 1000, 500});
}

TEST_CASE("a gather of 1 to 9 buffers beyond iov_limit 4 lands byte-exact", "[segment_plan]") {
  std::mt19937_64 random(9);
  std::vector<std::byte> memory(8192);
  for (std::size_t buffers = 1; buffers <= 9; ++buffers) {
    std::vector<std::size_t> lengths;
    for (std::size_t i = 0; i < buffers; ++i)
      lengths.push_back(100 + 37 * i);
    std::size_t total = 0;
    for (std::size_t length : lengths)
      total += length;
    Shape shape{carve_local(memory, lengths, random), carve_remote({total}, random)};
    const Walk result = walk(shape, {SIZE_MAX, 4, 4});
    INFO(buffers << " buffers");
    REQUIRE(result.problem == "");
    REQUIRE(result.posts == (buffers + 3) / 4);
  }
}

TEST_CASE("a read scattered over 1 to 9 remote segments beyond rma_iov_limit 4 lands byte-exact", "[segment_plan]") {
  std::mt19937_64 random(10);
  std::vector<std::byte> memory(8192);
  for (std::size_t segments = 1; segments <= 9; ++segments) {
    std::vector<std::size_t> lengths(segments, 64);
    Shape shape{carve_local(memory, {64 * segments}, random), carve_remote(lengths, random)};
    const Walk result = walk(shape, {SIZE_MAX, 4, 4});
    INFO(segments << " segments");
    REQUIRE(result.problem == "");
    REQUIRE(result.posts == (segments + 3) / 4);
  }
}

TEST_CASE("a gather also split by max_bytes cuts a buffer between two posts", "[segment_plan]") {
  std::vector<std::byte> memory(64);
  const LocalSegment local[] = {{memory.data(), 10, nullptr}, {memory.data() + 20, 10, nullptr}};
  const RemoteSegment remote[] = {{0, 20, 3}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make(local, remote, {15, 4, 4}, error);
  SegmentPost post;
  SegmentCursor at = plan.fill({}, post);
  REQUIRE(post.iov_count == 2);
  REQUIRE(post.iov[1].iov_base == memory.data() + 20);
  REQUIRE(post.iov[1].iov_len == 5);
  at = plan.fill(at, post);
  REQUIRE(post.iov_count == 1);
  REQUIRE(post.iov[0].iov_base == memory.data() + 25);
  REQUIRE(post.rma[0].addr == 15);
  REQUIRE(plan.finished(at));
}

TEST_CASE("each local entry carries its own buffer's descriptor", "[segment_plan]") {
  std::vector<std::byte> memory(64);
  int a = 0;
  int b = 0;
  const LocalSegment local[] = {{memory.data(), 8, &a}, {memory.data() + 8, 8, &b}};
  const RemoteSegment remote[] = {{0, 16, 3}};
  ShapeError error{};
  SegmentPost post;
  (void)SegmentPlan::make(local, remote, {SIZE_MAX, 4, 4}, error).fill({}, post);
  REQUIRE(post.desc[0] == &a);
  REQUIRE(post.desc[1] == &b);
}

TEST_CASE("a zero-length transfer is one empty post that still carries the remote key", "[segment_plan]") {
  std::vector<std::byte> memory(8);
  const LocalSegment local[] = {{memory.data(), 0, nullptr}};
  const RemoteSegment remote[] = {{4096, 0, 42}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make(local, remote, {1024, 4, 4}, error);
  REQUIRE(error == ShapeError::none);
  REQUIRE_FALSE(plan.finished({}));
  SegmentPost post;
  const SegmentCursor at = plan.fill({}, post);
  REQUIRE(post.bytes == 0);
  REQUIRE(post.iov_count == 1);
  REQUIRE(post.iov[0].iov_len == 0);
  REQUIRE(post.rma_count == 1);
  REQUIRE(post.rma[0].key == 42);
  REQUIRE(post.rma[0].addr == 4096);
  REQUIRE(plan.finished(at));
  REQUIRE(plan.count_posts() == 1);
}

TEST_CASE("a zero-length transfer may name no local buffer at all", "[segment_plan]") {
  const RemoteSegment remote[] = {{0, 0, 1}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make({}, remote, {1024, 4, 4}, error);
  REQUIRE(error == ShapeError::none);
  SegmentPost post;
  (void)plan.fill({}, post);
  REQUIRE(post.iov[0].iov_base == nullptr);
  REQUIRE(post.iov[0].iov_len == 0);
}

TEST_CASE("empty buffers between others take no iov slot", "[segment_plan]") {
  std::vector<std::byte> memory(64);
  const LocalSegment local[] = {{memory.data(), 0, nullptr},      {memory.data(), 4, nullptr},
                                {memory.data() + 4, 0, nullptr},  {memory.data() + 8, 4, nullptr},
                                {memory.data() + 12, 0, nullptr}, {memory.data() + 16, 4, nullptr}};
  const RemoteSegment remote[] = {{0, 0, 1}, {0, 12, 1}, {12, 0, 1}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make(local, remote, {SIZE_MAX, 3, 1}, error);
  SegmentPost post;
  const SegmentCursor at = plan.fill({}, post);
  REQUIRE(post.iov_count == 3);
  REQUIRE(post.rma_count == 1);
  REQUIRE(post.bytes == 12);
  REQUIRE(plan.finished(at));
}

TEST_CASE("a post refused by the provider is filled again, identical, from the same cursor", "[segment_plan]") {
  std::vector<std::byte> memory(64);
  const LocalSegment local[] = {{memory.data(), 10, nullptr}, {memory.data() + 16, 10, nullptr}};
  const RemoteSegment remote[] = {{0, 20, 3}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make(local, remote, {7, 4, 4}, error);
  SegmentPost first;
  SegmentPost again;
  const SegmentCursor at = plan.fill({}, first);
  const SegmentCursor a = plan.fill(at, first);
  const SegmentCursor b = plan.fill(at, again);
  REQUIRE(a == b);
  REQUIRE(first.iov_count == again.iov_count);
  REQUIRE(first.iov[0].iov_base == again.iov[0].iov_base);
  REQUIRE(first.rma[0].addr == again.rma[0].addr);
  REQUIRE(first.bytes == again.bytes);
}

TEST_CASE("limits above a post's capacity are clamped to it", "[segment_plan]") {
  std::vector<std::byte> memory(64);
  std::vector<LocalSegment> local;
  for (std::size_t i = 0; i < 20; ++i)
    local.push_back({memory.data() + 2 * i, 1, nullptr});
  const RemoteSegment remote[] = {{0, 20, 3}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make(local, remote, {SIZE_MAX, 1000, 1000}, error);
  REQUIRE(plan.limits().iov_limit == SegmentPost::capacity);
  REQUIRE(plan.count_posts() == 3);  // 8 + 8 + 4
}

TEST_CASE("local and remote lengths that differ are refused, naming both totals", "[segment_plan]") {
  std::vector<std::byte> memory(64);
  const LocalSegment local[] = {{memory.data(), 10, nullptr}, {memory.data() + 10, 6, nullptr}};
  const RemoteSegment remote[] = {{0, 20, 3}};
  ShapeError error{};
  const SegmentPlan plan = SegmentPlan::make(local, remote, {1024, 4, 4}, error);
  REQUIRE(error == ShapeError::lengths_differ);
  REQUIRE(plan.finished({}));  // nothing to post
  REQUIRE(plan.total() == 0);
  REQUIRE(describe(error, local, remote, {1024, 4, 4}) == "2 local buffers total 16 bytes, 1 remote segments 20");
}

TEST_CASE("shapes that cannot be posted are refused with their reason", "[segment_plan]") {
  std::vector<std::byte> memory(64);
  const LocalSegment local[] = {{memory.data(), 16, nullptr}};
  const RemoteSegment remote[] = {{0, 16, 3}};
  REQUIRE(SegmentPlan::check(local, {}, {1024, 4, 4}) == ShapeError::no_remote_segment);
  REQUIRE(SegmentPlan::check(local, remote, {0, 4, 4}) == ShapeError::zero_limit);
  REQUIRE(SegmentPlan::check(local, remote, {1024, 0, 4}) == ShapeError::zero_limit);
  REQUIRE(SegmentPlan::check(local, remote, {1024, 4, 0}) == ShapeError::zero_limit);
  REQUIRE(describe(ShapeError::zero_limit, local, remote, {1024, 0, 4}) ==
          "segment limits must be positive: max_bytes 1024, iov_limit 0, rma_iov_limit 4");

  const LocalSegment wrapping[] = {fake_local(UINTPTR_MAX - 7, 16)};
  REQUIRE(SegmentPlan::check(wrapping, remote, {1024, 4, 4}) == ShapeError::local_range_overflows);
  REQUIRE(describe(ShapeError::local_range_overflows, wrapping, remote, {}) ==
          "local buffer 0 of 16 bytes wraps around the address space");

  const RemoteSegment wrapping_remote[] = {{UINT64_MAX - 7, 16, 3}};
  REQUIRE(SegmentPlan::check(local, wrapping_remote, {1024, 4, 4}) == ShapeError::remote_range_overflows);

  const LocalSegment huge[] = {fake_local(0x1000, SIZE_MAX / 2 + 1), fake_local(0x2000, SIZE_MAX / 2 + 1)};
  const RemoteSegment huge_remote[] = {{0, SIZE_MAX / 2 + 1, 1}, {0, SIZE_MAX / 2 + 1, 1}};
  REQUIRE(SegmentPlan::check(huge, remote, {1024, 4, 4}) == ShapeError::total_overflows);
  REQUIRE(SegmentPlan::check(local, huge_remote, {1024, 4, 4}) == ShapeError::total_overflows);
}

TEST_CASE("the checksum of several buffers is the checksum of their concatenation", "[segment_plan]") {
  std::vector<std::byte> whole(1000);
  for (std::size_t i = 0; i < whole.size(); ++i)
    whole[i] = std::byte(static_cast<unsigned char>(i * 7 + 3));
  std::vector<std::byte> a(whole.begin(), whole.begin() + 1);
  std::vector<std::byte> b(whole.begin() + 1, whole.begin() + 600);
  std::vector<std::byte> c(whole.begin() + 600, whole.end());
  const LocalSegment local[] = {{a.data(), a.size(), nullptr},
                                {nullptr, 0, nullptr},
                                {b.data(), b.size(), nullptr},
                                {c.data(), c.size(), nullptr}};
  REQUIRE(dma::detail::checksum(local) == dma::checksum(whole));
  REQUIRE(dma::detail::checksum(std::span<const LocalSegment>{}) == 0);
}
