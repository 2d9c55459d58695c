// A fake completion queue and fabric for the engine's parts: fi_cq_read, fi_cq_readerr and
// fi_trywait reach these through the ops tables libfabric's inline calls dispatch on.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <cstddef>
#include <deque>
#include <vector>

namespace test {

/// Entries queued with push() come out of fi_cq_read in order; an error entry stops a read and
/// makes the next one return -FI_EAVAIL, as a provider does.
struct FakeCq {
  struct Entry {
    void* context = nullptr;
    int err = 0;  ///< non-zero: an error entry
  };

  FakeCq() {
    ops.size = sizeof ops;
    ops.read = &read;
    ops.readerr = &readerr;
    cq.ops = &ops;
  }
  FakeCq(const FakeCq&) = delete;

  void push(void* context, int err = 0) { entries.push_back({context, err}); }

  static FakeCq& of(fid_cq* cq) {
    return *reinterpret_cast<FakeCq*>(reinterpret_cast<char*>(cq) - offsetof(FakeCq, cq));
  }

  static ssize_t read(fid_cq* cq, void* buf, std::size_t count) {
    FakeCq& self = of(cq);
    ++self.reads;
    if (self.fail_reads) return -FI_EIO;
    if (count == 0) return self.entries.empty() ? -FI_EAGAIN : 0;  // as libfabric's util CQ
    if (!self.entries.empty() && self.entries.front().err != 0) return -FI_EAVAIL;
    auto* out = static_cast<fi_cq_entry*>(buf);
    std::size_t n = 0;
    while (n < count && !self.entries.empty() && self.entries.front().err == 0) {
      out[n++].op_context = self.entries.front().context;
      self.entries.pop_front();
    }
    return n == 0 ? -FI_EAGAIN : static_cast<ssize_t>(n);
  }

  static ssize_t readerr(fid_cq* cq, fi_cq_err_entry* buf, std::uint64_t) {
    FakeCq& self = of(cq);
    if (self.fail_readerr || self.entries.empty()) return -FI_EIO;
    buf->op_context = self.entries.front().context;
    buf->err = self.entries.front().err;
    self.entries.pop_front();
    return 1;
  }

  fid_cq cq{};
  fi_ops_cq ops{};
  std::deque<Entry> entries;
  int reads = 0;
  bool fail_reads = false;
  bool fail_readerr = false;
};

/// fi_trywait answers `trywait` (0: the caller may wait; -FI_EAGAIN: completions are pending).
struct FakeFabric {
  FakeFabric() {
    ops.size = sizeof ops;
    ops.trywait = &trywait;
    fabric.ops = &ops;
  }
  FakeFabric(const FakeFabric&) = delete;

  static int trywait(fid_fabric* fabric, fid**, int) {
    auto& self = *reinterpret_cast<FakeFabric*>(reinterpret_cast<char*>(fabric) - offsetof(FakeFabric, fabric));
    ++self.trywaits;
    return self.answer;
  }

  fid_fabric fabric{};
  fi_ops_fabric ops{};
  int answer = 0;
  int trywaits = 0;
};

}  // namespace test
