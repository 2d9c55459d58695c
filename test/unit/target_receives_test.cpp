// The receives a Target keeps posted where writes with immediate data consume them
// (FI_RX_CQ_DATA), over a fake receive queue modelled on efa-direct 2.6: posted at start, one
// notification per write, each receive posted again, a refused post retried.
#include "target_receives.hpp"
#include "../catch.hpp"
#include "hints.hpp"

#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <vector>

using dma::Configuration;
using dma::Provider;

namespace {

// A receive queue as efa-direct keeps it: posts up to its size, then -FI_EAGAIN.
struct FakeReceiveQueue {
  std::size_t capacity;
  std::vector<void*> posted;
  std::size_t posts = 0;
  int post(void* context) {
    if (posted.size() >= capacity) return -FI_EAGAIN;
    posted.push_back(context);
    ++posts;
    return 0;
  }
  // A peer's write with immediate data consuming the oldest receive (efa_cq.c:26-27, :70-73).
  fi_cq_data_entry consume(std::uint64_t data) {
    REQUIRE_FALSE(posted.empty());
    fi_cq_data_entry entry{};
    entry.op_context = posted.front();
    entry.flags = FI_REMOTE_CQ_DATA | FI_RMA | FI_REMOTE_WRITE;
    entry.data = data;
    posted.erase(posted.begin());
    return entry;
  }
};

}  // namespace

TEST_CASE(
    "with FI_RX_CQ_DATA a Target posts its receives, and a write with immediate data notifies once and "
    "re-posts",
    "[target_receives]") {
  Configuration configuration;
  configuration.providers = {Provider::efa_direct};
  configuration.notification_queue = 4;
  // efa-direct 2.6's answer to the library's hints (efa_user_info.c:519-522).
  dma::detail::InfoList answer(fi_allocinfo());
  answer->mode = FI_CONTEXT2 | FI_RX_CQ_DATA;
  answer->rx_attr->size = 8192;
  const auto use = dma::detail::read_answer(*answer, configuration, FI_VERSION(2, 6));
  FakeReceiveQueue queue{use.target_receives, {}};
  dma::detail::TargetReceives receives;
  receives.start(use.target_receives, [&](void* context) { return queue.post(context); });
  CHECK(receives.count() == 4);
  CHECK(receives.posted() == 4);
  CHECK(queue.posted.size() == 4);

  int notifications = 0;
  for (std::uint64_t i = 0; i < 10; ++i) {  // more writes than receives: each is re-posted
    if (receives.notifies(queue.consume(i))) ++notifications;
    CHECK(receives.posted() == 4);
  }
  CHECK(notifications == 10);
  CHECK(receives.consumed() == 10);
  CHECK(queue.posts == 14);

  // A write with immediate data on a provider that consumes no receive (tcp): notified, nothing posted.
  fi_cq_data_entry unsolicited{};
  unsolicited.flags = FI_REMOTE_CQ_DATA | FI_RMA | FI_REMOTE_WRITE;
  CHECK(receives.notifies(unsolicited));
  CHECK(receives.consumed() == 10);
  CHECK(queue.posts == 14);
}

TEST_CASE("a receive that could not be posted is posted at the next completion", "[target_receives]") {
  FakeReceiveQueue queue{2, {}};
  dma::detail::TargetReceives receives;
  receives.start(3, [&](void* context) { return queue.post(context); });
  CHECK(receives.posted() == 2);
  CHECK(receives.failed_posts() == 1);
  queue.capacity = 3;
  CHECK(receives.notifies(queue.consume(7)));
  CHECK(receives.posted() == 3);
  CHECK(queue.posted.size() == 3);
}

TEST_CASE("a flushed receive is the Target's own, not a peer's error", "[target_receives]") {
  FakeReceiveQueue queue{1, {}};
  dma::detail::TargetReceives receives;
  receives.start(1, [&](void* context) { return queue.post(context); });
  fi_cq_err_entry flushed{};
  flushed.op_context = queue.posted.front();
  flushed.err = FI_ECANCELED;
  queue.posted.clear();
  CHECK(receives.owns_error(flushed));
  fi_cq_err_entry other{};
  CHECK_FALSE(receives.owns_error(other));
}

TEST_CASE("no receives: every entry with immediate data notifies, others do not", "[target_receives]") {
  dma::detail::TargetReceives none;
  fi_cq_data_entry write{};
  write.flags = FI_REMOTE_CQ_DATA | FI_RMA | FI_REMOTE_WRITE;
  CHECK(none.notifies(write));
  fi_cq_data_entry own{};
  own.flags = FI_RMA | FI_WRITE;
  CHECK_FALSE(none.notifies(own));
  CHECK(none.count() == 0);
}
