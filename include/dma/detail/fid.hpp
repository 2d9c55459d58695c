// One owner per libfabric object: Fid<T> closes its fid exactly once.
#pragma once

#include <dma/export.hpp>

#include <memory>
#include <utility>

// libfabric's object types, declared here so that no libfabric header (and none of its macros)
// reaches a user's translation unit; lib/ includes the definitions.
struct fid_av;
struct fid_cq;
struct fid_domain;
struct fid_ep;
struct fid_fabric;
struct fid_mr;
struct fi_info;

namespace dma::detail {

/// fi_close of one libfabric object, one overload per type Fid owns; fi_close's result.
DMA_EXPORT int close_fid(fid_av* object) noexcept;
DMA_EXPORT int close_fid(fid_cq* object) noexcept;
DMA_EXPORT int close_fid(fid_domain* object) noexcept;
DMA_EXPORT int close_fid(fid_ep* object) noexcept;
DMA_EXPORT int close_fid(fid_fabric* object) noexcept;
DMA_EXPORT int close_fid(fid_mr* object) noexcept;

/// Owns one libfabric object (fid_fabric, fid_domain, fid_av, fid_cq, fid_ep, fid_mr).
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
    return close_fid(std::exchange(object_, nullptr));
  }

 private:
  T* object_ = nullptr;
};

/// Frees an fi_info list (fi_getinfo's or fi_dupinfo's) with fi_freeinfo.
struct DMA_EXPORT InfoDeleter {
  void operator()(fi_info* info) const noexcept;
};
/// Owns an fi_info list.
using InfoList = std::unique_ptr<fi_info, InfoDeleter>;

}  // namespace dma::detail
