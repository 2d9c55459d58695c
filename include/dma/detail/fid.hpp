// One owner per libfabric object: Fid<T> closes its fid exactly once.
#pragma once

#include <rdma/fabric.h>

#include <memory>
#include <utility>

namespace dma::detail {

/// Owns one libfabric object (fid_fabric, fid_domain, fid_av, fid_cq, fid_ep, fid_mr, ...).
template <typename T>
class Fid {
 public:
  Fid() noexcept = default;
  explicit Fid(T* object) noexcept : object_(object) {}
  Fid(const Fid&) = delete;
  Fid& operator=(const Fid&) = delete;
  Fid(Fid&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  Fid& operator=(Fid&& other) noexcept {
    if (this != &other) {
      reset();
      object_ = std::exchange(other.object_, nullptr);
    }
    return *this;
  }
  ~Fid() { reset(); }

  T* get() const noexcept { return object_; }
  T** out() noexcept {
    reset();
    return &object_;
  }
  explicit operator bool() const noexcept { return object_ != nullptr; }
  /// Gives up ownership without closing.
  T* release() noexcept { return std::exchange(object_, nullptr); }
  /// fi_close's result (0 when nothing was open).
  int reset() noexcept {
    if (object_ == nullptr) return 0;
    return fi_close(&std::exchange(object_, nullptr)->fid);
  }

 private:
  T* object_ = nullptr;
};

/// Frees an fi_info list (fi_getinfo's or fi_dupinfo's) with fi_freeinfo.
struct InfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};
/// Owns an fi_info list.
using InfoList = std::unique_ptr<fi_info, InfoDeleter>;

}  // namespace dma::detail
