// The hints seam: for each provider and libfabric version, the hints the library passes to
// fi_getinfo and how it reads the answer, against fake answers modelled on each version's provider
// source (libfabric-VERSION/prov/...). No device, no fabric: a regression in the efa-direct rules
// shows here. docs/notes/efa-direct.md has the same citations.
#include "hints.hpp"
#include "../catch.hpp"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

using dma::Configuration;
using dma::Provider;
using dma::detail::InfoList;

namespace {

constexpr std::uint64_t mr_modes = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
constexpr std::uint64_t rma_caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

// What one efa device offers, as efa_device.c reads it from rdma-core.
struct EfaDevice {
  bool unsolicited_write_recv = true;
};

// What a provider answers to hints, as the provider's getinfo of that version decides; nullopt is
// -FI_ENODATA. Only the fields the library reads are modelled.
struct Answer {
  std::uint64_t mode = 0;
  std::uint64_t caps = 0;
  std::size_t rx_size = 0;
};
using Model = std::optional<Answer> (*)(const fi_info& hints, EfaDevice device);

// 2.1 efa_prov_info.c:470 sets FI_CONTEXT2 in efa-direct's mode; :473-479 claim FI_RMA only on a
// device with RDMA read, RDMA write and unsolicited write receive. efa_user_info.c has no
// FI_RX_CQ_DATA rule: the bit in hints is neither required nor answered.
std::optional<Answer> efa_direct_2_1(const fi_info& hints, EfaDevice device) {
  if ((hints.mode & FI_CONTEXT2) == 0) return std::nullopt;  // ofi_check_info: a mode the app lacks
  Answer a{FI_CONTEXT2, FI_MSG, 8192};
  if (device.unsolicited_write_recv) a.caps |= FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  if ((hints.caps & FI_RMA) != 0 && (a.caps & FI_RMA) == 0) return std::nullopt;
  return a;
}

// 2.3 behaves as 2.1 for caps and mode (the FI_RX_CQ_DATA rule arrives in 2.4); its CQ takes a
// wait fd (libfabric-notes §9).
std::optional<Answer> efa_direct_2_3(const fi_info& hints, EfaDevice device) { return efa_direct_2_1(hints, device); }

// 2.6 efa_prov_info.c:475 sets FI_CONTEXT2; :485-490 claim FI_RMA with RDMA read and write.
// efa_user_info.c:519-522 answers FI_RX_CQ_DATA when the hints' mode holds it; :529-541 refuse
// hints asking FI_RMA without it on a device lacking unsolicited write receive.
std::optional<Answer> efa_direct_2_6(const fi_info& hints, EfaDevice device) {
  if ((hints.mode & FI_CONTEXT2) == 0) return std::nullopt;
  Answer a{FI_CONTEXT2, rma_caps, 8192};
  if ((hints.mode & FI_RX_CQ_DATA) != 0) a.mode |= FI_RX_CQ_DATA;
  if (!device.unsolicited_write_recv && (a.mode & FI_RX_CQ_DATA) == 0 && (hints.caps & FI_RMA) != 0) {
    return std::nullopt;
  }
  return a;
}

// tcp and shm set no mode bit (2.6 prov/tcp/src/xnet_attr.c, prov/shm/src/smr_attr.c: no FI_RX_CQ_DATA
// anywhere); their RMA needs no posted receive.
std::optional<Answer> no_receive_provider(const fi_info& hints, EfaDevice) { return Answer{0, hints.caps, 256}; }

struct Row {
  const char* what;
  Provider provider;
  std::uint32_t version;
  Model model;
  // The hints.
  std::uint64_t mode;
  const char* prov_name;
  const char* fabric;  // nullptr: no fabric name
  std::size_t tx_size;
  // How the answer is read.
  fi_wait_obj cq_wait;
  std::uint64_t transmit_flag;
  bool delivery_confirmed;
  std::size_t target_receives;  // with notification_queue = 4096
};

// Each expectation's source: see the model it names and the comments on the rows.
const Row rows[] = {
    // 1.17: tcp RDM is rxm over tcp (hints.cpp tcp_rdm_is_rxm_only); CQ wait fd on rxm.
    {"tcp on 1.17", Provider::tcp, FI_VERSION(1, 17), no_receive_provider, 0, "tcp;ofi_rxm", nullptr, 0, FI_WAIT_FD,
     FI_INJECT_COMPLETE, true, 0},
    // 2.6: native tcp; tx size asked (xnet default 256); FI_WAIT_FD works on its CQ (notes §9).
    {"tcp on 2.6", Provider::tcp, FI_VERSION(2, 6), no_receive_provider, 0, "tcp", nullptr, 2048, FI_WAIT_FD,
     FI_INJECT_COMPLETE, true, 0},
    // shm's CQ refuses FI_WAIT_FD (fi_cq_open -FI_ENOSYS, notes §1): the library polls.
    {"shm on 2.6", Provider::shm, FI_VERSION(2, 6), no_receive_provider, 0, "shm", nullptr, 0, FI_WAIT_NONE,
     FI_INJECT_COMPLETE, true, 0},
    // 2.1 efa_cq.c:425: fi_cq_open returns -FI_ENOSYS for any wait_obj but FI_WAIT_NONE.
    // efa_prov_info.c:22 EFA_TX_OP_FLAGS = FI_TRANSMIT_COMPLETE: no delivery completion.
    {"efa-direct on 2.1", Provider::efa_direct, FI_VERSION(2, 1), efa_direct_2_1, FI_CONTEXT2, "efa", "efa-direct", 0,
     FI_WAIT_NONE, FI_TRANSMIT_COMPLETE, false, 0},
    // 2.3: blocking CQ reads and FI_GETWAIT (a comp channel: 2.6 efa_cq.c:1025, :979).
    {"efa-direct on 2.3", Provider::efa_direct, FI_VERSION(2, 3), efa_direct_2_3, FI_CONTEXT2, "efa", "efa-direct", 0,
     FI_WAIT_FD, FI_TRANSMIT_COMPLETE, false, 0},
    // 2.6 efa_user_info.c:519-541: FI_RX_CQ_DATA asked, answered, and then each write with
    // immediate data consumes a receive (efa_cq.c:26-27, :70-73: its entry carries the receive's
    // context); receives = min(rx size, notification_queue).
    {"efa-direct on 2.6", Provider::efa_direct, FI_VERSION(2, 6), efa_direct_2_6, FI_CONTEXT2 | FI_RX_CQ_DATA, "efa",
     "efa-direct", 0, FI_WAIT_FD, FI_TRANSMIT_COMPLETE, false, 4096},
};

struct Hints {
  InfoList info{fi_allocinfo()};
};

Hints hints_for(const Row& row) {
  Configuration configuration;
  configuration.providers = {row.provider};
  Hints h;
  REQUIRE(h.info);
  dma::detail::fill_hints(*h.info, configuration, row.provider, row.version);
  return h;
}

InfoList answer_info(const Answer& answer) {
  InfoList info(fi_allocinfo());
  info->mode = answer.mode;
  info->caps = answer.caps;
  info->rx_attr->size = answer.rx_size;
  return info;
}

}  // namespace

TEST_CASE("the library's hints follow each provider's rules on each libfabric version", "[hints]") {
  for (const Row& row : rows) {
    CAPTURE(row.what);
    const Hints h = hints_for(row);
    const fi_info& hints = *h.info;
    CHECK(hints.mode == row.mode);
    CHECK(hints.caps == rma_caps);
    CHECK(hints.domain_attr->mr_mode == static_cast<int>(mr_modes));
    CHECK(hints.domain_attr->threading == FI_THREAD_DOMAIN);
    CHECK(hints.ep_attr->type == FI_EP_RDM);
    CHECK(std::string(hints.fabric_attr->prov_name) == row.prov_name);
    CHECK((hints.fabric_attr->name == nullptr) == (row.fabric == nullptr));
    if (row.fabric != nullptr && hints.fabric_attr->name != nullptr)
      CHECK(std::string(hints.fabric_attr->name) == row.fabric);
    CHECK(hints.tx_attr->size == row.tx_size);
  }
}

TEST_CASE("the library reads each provider's answer as that version's provider source means it", "[hints]") {
  for (const Row& row : rows) {
    CAPTURE(row.what);
    const Hints h = hints_for(row);
    const auto answer = row.model(*h.info, EfaDevice{});
    REQUIRE(answer);
    Configuration configuration;
    configuration.providers = {row.provider};
    const auto use = dma::detail::read_answer(*answer_info(*answer), configuration, row.version);
    CHECK(use.cq_wait == row.cq_wait);
    CHECK(use.transmit_flag == row.transmit_flag);
    CHECK(use.delivery_confirmed == row.delivery_confirmed);
    CHECK(use.target_receives == row.target_receives);
    CHECK_FALSE(dma::detail::completion_guarantee(row.provider, dma::CompletionLevel::delivery, use).empty());
  }
}

TEST_CASE(
    "efa-direct on 2.6 with RMA is offered with the library's hints on a device without unsolicited "
    "write receive",
    "[hints]") {
  const Row& row = rows[5];
  REQUIRE(row.version == FI_VERSION(2, 6));
  const Hints h = hints_for(row);
  CHECK(efa_direct_2_6(*h.info, EfaDevice{false}));
  CHECK(efa_direct_2_6(*h.info, EfaDevice{true}));
  // Without the bit the same device refuses efa-direct (efa_user_info.c:529-541): what the
  // library asked before it followed the 2.4 rule.
  InfoList old(fi_dupinfo(h.info.get()));
  old->mode &= ~FI_RX_CQ_DATA;
  CHECK_FALSE(efa_direct_2_6(*old, EfaDevice{false}));
}

TEST_CASE("efa-direct on 2.1 offers RMA only on a device with unsolicited write receive", "[hints]") {
  const Hints h = hints_for(rows[3]);
  CHECK(efa_direct_2_1(*h.info, EfaDevice{true}));
  CHECK_FALSE(efa_direct_2_1(*h.info, EfaDevice{false}));
}

TEST_CASE("the version predicates change at the versions the provider sources name", "[hints]") {
  using namespace dma::detail;
  CHECK_FALSE(efa_direct_cq_takes_wait_fd(FI_VERSION(2, 1)));
  CHECK_FALSE(efa_direct_cq_takes_wait_fd(FI_VERSION(2, 2)));
  CHECK(efa_direct_cq_takes_wait_fd(FI_VERSION(2, 3)));
  CHECK_FALSE(efa_direct_asks_rx_cq_data(FI_VERSION(2, 3)));
  CHECK(efa_direct_asks_rx_cq_data(FI_VERSION(2, 4)));
  CHECK(efa_direct_asks_rx_cq_data(FI_VERSION(2, 6)));
  CHECK_FALSE(endpoint_answers_size_options(FI_VERSION(1, 17)));
  CHECK(endpoint_answers_size_options(FI_VERSION(2, 1)));
}

TEST_CASE("a Target's receives follow the answer: none without FI_RX_CQ_DATA, at most notification_queue with it",
          "[hints][target_receives]") {
  Configuration configuration;
  configuration.providers = {Provider::efa_direct};
  configuration.notification_queue = 16;
  CHECK(dma::detail::read_answer(*answer_info({FI_CONTEXT2, rma_caps, 8192}), configuration, FI_VERSION(2, 6))
            .target_receives == 0);
  CHECK(dma::detail::read_answer(*answer_info({FI_CONTEXT2 | FI_RX_CQ_DATA, rma_caps, 8192}), configuration,
                                 FI_VERSION(2, 6))
            .target_receives == 16);
  CHECK(dma::detail::read_answer(*answer_info({FI_CONTEXT2 | FI_RX_CQ_DATA, rma_caps, 8}), configuration,
                                 FI_VERSION(2, 6))
            .target_receives == 8);
}
