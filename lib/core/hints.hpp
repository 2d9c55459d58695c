// fi_getinfo with the hints of each Provider; shared by Endpoint::open and discover_domains.
#pragma once

#include "dma/configuration.hpp"
#include "dma/detail/fid.hpp"
#include "dma/transfer.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

namespace dma::detail {

/// Sets the process-wide libfabric variables the library relies on (FI_AV_REMOVE_CLEANUP) and
/// those of ProcessSettings, once, before libfabric first initialises; never overrides a value
/// already set. After it, set_process_settings() refuses.
void prepare_environment() noexcept;

// What differs between the libfabric versions the library runs on (1.17, 2.1, 2.6), each named
// after what it is; docs/notes/libfabric-versions.md has the measurements behind them.

/// Before 1.18 tcp has no RDM endpoint of its own: tcp RDM is rxm over tcp (`tcp;ofi_rxm`).
/// From 1.18 on it is the native tcp provider (FI_PROTO_XNET), whose wire rxm cannot read.
bool tcp_rdm_is_rxm_only(std::uint32_t version) noexcept;

/// rxm's connection request carries its eager limit, and rxm refuses a peer whose limit differs.
/// On 1.17 the limit is a setting of its own (FI_OFI_RXM_EAGER_LIMIT, default 16384) that may
/// stay above the bounce-buffer size over tcp; in 2.x it is the buffer size itself.
bool rxm_eager_limit_is_its_own_setting(std::uint32_t version) noexcept;

/// efa-direct's completion queue takes FI_WAIT_FD (blocking reads, FI_GETWAIT) from 2.3 on; on 2.1
/// and 2.2 fi_cq_open refuses every wait object but FI_WAIT_NONE, so the library polls.
bool efa_direct_cq_takes_wait_fd(std::uint32_t version) noexcept;

/// From 2.4 on, efa-direct on a device without unsolicited write receive offers FI_RMA only to
/// hints whose mode holds FI_RX_CQ_DATA, and an answer with that bit makes every write with
/// immediate data consume a receive the target posted. The library asks for it from 2.4 on.
bool efa_direct_asks_rx_cq_data(std::uint32_t version) noexcept;

/// FI_OPT_MAX_RMA_SIZE, FI_OPT_SHARED_MEMORY_PERMITTED and FI_OPT_EFA_EMULATED_READ/WRITE exist
/// in 2.x; libfabric 1.17 knows none of them (its headers lack the values).
bool endpoint_answers_size_options(std::uint32_t version) noexcept;

/// Endpoint option values that libfabric 1.17's headers lack, declared from fi_endpoint(3) and
/// fi_efa(7) (the FI_OPT_ENDPOINT option list, and efa's options counted from
/// -FI_PROV_SPECIFIC_EFA). Use them only where endpoint_answers_size_options() holds.
namespace endpoint_option {
inline constexpr int shared_memory_permitted = 11;            ///< FI_OPT_SHARED_MEMORY_PERMITTED, bool
inline constexpr int max_rma_size = 14;                       ///< FI_OPT_MAX_RMA_SIZE, size_t
inline constexpr int efa_rnr_retry = -(0xefa << 16);          ///< FI_OPT_EFA_RNR_RETRY, size_t
inline constexpr int efa_emulated_read = efa_rnr_retry + 1;   ///< FI_OPT_EFA_EMULATED_READ, bool
inline constexpr int efa_emulated_write = efa_rnr_retry + 2;  ///< FI_OPT_EFA_EMULATED_WRITE, bool
}  // namespace endpoint_option

/// The hints the library passes to fi_getinfo for `provider` on libfabric `version`: caps, mode,
/// mr_mode, threading, provider and fabric names, tx size. Allocates the name strings.
void fill_hints(fi_info& hints, const Configuration& configuration, Provider provider, std::uint32_t version);

/// What the library takes from a provider's fi_getinfo answer.
struct AnswerUse {
  /// FI_WAIT_FD, or FI_WAIT_NONE where the provider's CQ takes no fd (or busy_poll): progress polls.
  fi_wait_obj cq_wait = FI_WAIT_FD;
  /// The write flag for CompletionLevel::transmit.
  std::uint64_t transmit_flag = FI_INJECT_COMPLETE;
  /// Whether a write posted with FI_DELIVERY_COMPLETE completes only once the peer has the bytes.
  bool delivery_confirmed = true;
  /// Receives a Target posts so that writes with immediate data reach it (FI_RX_CQ_DATA in the
  /// answer's mode); 0 where the provider needs none.
  std::size_t target_receives = 0;
};

/// Reads `answer` (one fi_getinfo entry for `configuration`'s provider) as the library uses it on
/// libfabric `version`. Configuration::notification_queue bounds the receives a Target posts.
AnswerUse read_answer(const fi_info& answer, const Configuration& configuration, std::uint32_t version) noexcept;

/// What a completed write of `level` guarantees on `provider`, given how read_answer() read its
/// answer, in one sentence for diagnostics such as dma-info.
std::string_view completion_guarantee(Provider provider, CompletionLevel level, const AnswerUse& use) noexcept;

/// The first configured provider; tcp when none is.
Provider configured_provider(const Configuration& configuration) noexcept;

/// How progress waits on this provider: the configured wait mode, except busy_poll on shm, whose
/// completion queue has no wait object (fi_cq_open with FI_WAIT_FD is -FI_ENOSYS).
WaitMode progress_wait_mode(const Configuration& configuration) noexcept;

/// The provider's fi_info list for the configuration; on failure `what` names the step.
InfoList query_info(const Configuration& configuration, std::error_code& ec, std::string& what);

}  // namespace dma::detail
