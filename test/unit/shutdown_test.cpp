// Shutdown without a fabric: what is refused, what waits for the grace period, what the close
// completes, and that it closes exactly once.
#include "shutdown.hpp"
#include "../catch.hpp"
#include "ledger_rig.hpp"

#include <dma/error.hpp>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <chrono>
#include <memory>
#include <optional>

using namespace std::chrono_literals;

namespace {

struct FakeWatcher {
  int closes = 0;
  int detaches = 0;
  void close() { ++closes; }
  void detach() { ++detaches; }
};

using Timer = asio::steady_timer;

struct ShutdownRig : test::LedgerRig {
  explicit ShutdownRig(std::chrono::nanoseconds grace = 1h)
      : closer(std::make_shared<dma::detail::StrandCloser<asio::strand<asio::io_context::executor_type>>>(
            asio::make_strand(io.get_executor()))),
        registrar(closer),
        shutdown(io.get_executor(), grace,
                 {endpoint, table, registrar, ledger, reclaimer, poster, intake, watcher, log}) {}

  asio::io_context io;
  dma::Endpoint endpoint;
  std::optional<dma::detail::PeerTable> table;
  std::shared_ptr<dma::detail::RetiringCloser> closer;
  dma::detail::Registrar registrar;
  dma::detail::Intake intake;
  FakeWatcher watcher;
  dma::detail::Log log;
  dma::detail::Shutdown<FakeWatcher, Timer> shutdown;
};

}  // namespace

TEST_CASE("shutdown refuses waiting submissions and fails queued transfers, then closes") {
  ShutdownRig rig;
  auto* waiting = rig.submitted();
  (void)rig.intake.push(waiting);
  auto* queued = rig.queued();
  rig.shutdown.begin(*rig.host);
  const auto& finished = test::Record::get().finished;
  REQUIRE(finished.size() == 2);
  CHECK(finished[0].op == waiting);
  CHECK(finished[1].op == queued);
  for (const auto& f : finished)
    CHECK(f.ec == dma::errc::shutdown);
  CHECK(rig.shutdown.stopping());
  CHECK(rig.shutdown.closed());
  CHECK(rig.watcher.closes == 1);
  CHECK(rig.ledger.outstanding() == 0);
  rig.shutdown.begin(*rig.host);  // a second shutdown does nothing
  CHECK(finished.size() == 2);
  CHECK(rig.watcher.closes == 1);
}

TEST_CASE("a posted transfer gets the grace period, then completes with shutdown") {
  ShutdownRig rig(1ms);
  auto* posted = rig.posted();
  rig.shutdown.begin(*rig.host);
  CHECK(rig.shutdown.stopping());
  CHECK(!rig.shutdown.closed());
  CHECK(rig.host->progress == 1);
  CHECK(test::Record::get().finished.empty());
  rig.io.run_for(5s);  // returns once the grace timer ran
  CHECK(rig.shutdown.closed());
  CHECK(rig.host->drains == 100);  // the fake CQ never hands it back
  CHECK(rig.host->returns == 1);
  const auto& finished = test::Record::get().finished;
  REQUIRE(finished.size() == 1);
  CHECK(finished[0].op == posted);
  CHECK(finished[0].ec == dma::errc::shutdown);
  CHECK(rig.poster.idle());
}

TEST_CASE("abandoning an engine that never opened only detaches the watcher") {
  ShutdownRig rig;
  (void)rig.intake.push(rig.submitted());
  rig.shutdown.abandon();
  CHECK(rig.watcher.detaches == 1);
  CHECK(test::Record::get().destroyed.empty());
  CHECK(test::Record::get().finished.empty());
}
