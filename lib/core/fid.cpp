#include "dma/detail/fid.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

namespace dma::detail {

int close_fid(fid_av* object) noexcept { return fi_close(&object->fid); }
int close_fid(fid_cq* object) noexcept { return fi_close(&object->fid); }
int close_fid(fid_domain* object) noexcept { return fi_close(&object->fid); }
int close_fid(fid_ep* object) noexcept { return fi_close(&object->fid); }
int close_fid(fid_fabric* object) noexcept { return fi_close(&object->fid); }
int close_fid(fid_mr* object) noexcept { return fi_close(&object->fid); }

void InfoDeleter::operator()(fi_info* info) const noexcept { fi_freeinfo(info); }

}  // namespace dma::detail
