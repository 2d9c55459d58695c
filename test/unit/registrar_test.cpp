// The registrar against fake MRs: leases through the cache, the fallback, pins, closes on the strand.
#include "registrar.hpp"
#include "../catch.hpp"

#include <dma/error.hpp>

#include <asio/io_context.hpp>
#include <asio/strand.hpp>

#include <array>
#include <cstddef>
#include <thread>
#include <vector>

using dma::CacheableSpan;
using dma::detail::Fid;
using dma::detail::Operation;
using dma::detail::OperationFunctions;
using dma::detail::Registrar;
using dma::detail::state;

namespace {

// One fake fid_mr per registration; fi_close on it counts and frees it.
struct FakeMr {
  fid_mr mr{};
  static inline int closed = 0;
  static int close(fid* f) {
    delete reinterpret_cast<FakeMr*>(reinterpret_cast<char*>(f) - offsetof(FakeMr, mr) - offsetof(fid_mr, fid));
    ++closed;
    return 0;
  }
  static fi_ops make_ops() {
    fi_ops ops{};
    ops.size = sizeof ops;
    ops.close = &close;
    return ops;
  }
  static inline fi_ops ops = make_ops();
};

struct Registered {
  std::uintptr_t base;
  std::size_t length;
};

std::optional<CacheableSpan> span_of_test;
std::optional<CacheableSpan> cacheable_span(const Operation&) { return span_of_test; }
constexpr OperationFunctions functions{nullptr, nullptr, nullptr, &cacheable_span, nullptr, nullptr};

// An operation the engine holds for its whole life, over [base, base + size): its state, with the
// lease the registrar gives it, ends with it.
struct Operand : Operation {
  Operand(std::byte* base, std::size_t size) noexcept {
    functions = &::functions;
    buffer = base;
    length = size;
    dma::detail::begin_state(*this);
  }
  ~Operand() { dma::detail::end_state(*this); }
};

struct RegistrarRig {
  RegistrarRig() {
    registrar.open({&domain_key,
                    true,
                    false,
                    {},
                    [this](const void* base, std::size_t length, std::uint64_t, std::error_code& ec) {
                      Fid<fid_mr> out;
                      if (fail_next) {
                        fail_next = false;
                        ec = dma::fabric_error(-FI_ENOMEM);
                        return out;
                      }
                      auto* fake = new FakeMr;
                      fake->mr.fid.ops = &FakeMr::ops;
                      fake->mr.mem_desc = fake;
                      registered.push_back({reinterpret_cast<std::uintptr_t>(base), length});
                      return Fid<fid_mr>(&fake->mr);
                    }});
  }
  ~RegistrarRig() {
    registrar.release();
    span_of_test.reset();
  }
  asio::io_context io;
  using Strand = asio::strand<asio::io_context::executor_type>;
  int domain_key = 0;
  Registrar registrar{std::make_shared<dma::detail::StrandCloser<Strand>>(asio::make_strand(io))};
  std::array<std::byte, 4096> memory{};
  std::vector<Registered> registered;
  bool fail_next = false;
};

}  // namespace

TEST_CASE("operands inside a cacheable span share one registration of the span", "[unit][registrar]") {
  RegistrarRig rig;
  const auto base = reinterpret_cast<std::uintptr_t>(rig.memory.data());
  span_of_test = CacheableSpan{base, base + rig.memory.size()};
  Operand first(rig.memory.data(), 64);
  Operand second(rig.memory.data() + 1024, 64);
  std::error_code ec;
  rig.registrar.prepare(first, ec);
  REQUIRE_FALSE(ec);
  rig.registrar.prepare(second, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(rig.registered.size() == 1);
  CHECK(rig.registered[0].base == base);
  CHECK(rig.registered[0].length == rig.memory.size());
  CHECK(state(first).descriptor != nullptr);
  CHECK(state(second).descriptor == state(first).descriptor);
  CHECK(rig.registrar.cache_stats().hits == 1);
  CHECK(rig.registrar.registrations() == 1);
}

TEST_CASE("without a span the operand's registration lives only as long as its lease", "[unit][registrar]") {
  RegistrarRig rig;
  const int closed_before = FakeMr::closed;
  {
    Operand op(rig.memory.data() + 128, 256);
    std::error_code ec;
    rig.registrar.prepare(op, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(rig.registered.size() == 1);
    CHECK(rig.registered[0].length == 256);
    // The lease drops on another thread: the close waits for the strand.
    std::thread([lease = std::move(state(op).lease)]() mutable { lease.reset(); }).join();
    CHECK(FakeMr::closed == closed_before);
  }
  rig.io.run();
  CHECK(FakeMr::closed == closed_before + 1);
}

TEST_CASE("a span that fails to register falls back to the operand alone", "[unit][registrar]") {
  RegistrarRig rig;
  const auto base = reinterpret_cast<std::uintptr_t>(rig.memory.data());
  span_of_test = CacheableSpan{base, base + rig.memory.size()};
  rig.fail_next = true;
  Operand op(rig.memory.data() + 512, 64);
  std::error_code ec;
  rig.registrar.prepare(op, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(rig.registered.size() == 1);
  CHECK(rig.registered[0].base == base + 512);
  CHECK(rig.registered[0].length == 64);
}

TEST_CASE("an operand whose range overflows is refused before any registration", "[unit][registrar]") {
  RegistrarRig rig;
  Operand op(reinterpret_cast<std::byte*>(UINTPTR_MAX - 8), 64);
  std::error_code ec;
  rig.registrar.prepare(op, ec);
  CHECK(ec == dma::errc::operand_range_overflows);
  CHECK(rig.registered.empty());
}

TEST_CASE("pins are tracked until release, which closes every MR of the domain", "[unit][registrar]") {
  const int closed_before = FakeMr::closed;
  {
    RegistrarRig rig;
    const auto base = reinterpret_cast<std::uintptr_t>(rig.memory.data());
    CHECK(rig.registrar.pin(base, 0, nullptr) == dma::errc::zero_length_region);
    CHECK(rig.registrar.pin(UINTPTR_MAX - 1, 8, nullptr) == dma::errc::region_range_overflows);
    REQUIRE_FALSE(rig.registrar.pin(base, rig.memory.size(), nullptr));
    CHECK(rig.registrar.cache_stats().entries == 1);
    CHECK(FakeMr::closed == closed_before);
  }
  CHECK(FakeMr::closed == closed_before + 1);
}
