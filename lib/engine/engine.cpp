// The engine: a coordinator of parts that each have one job, all on one strand.
//
//   Intake          intake.hpp              submissions from any thread, and resubmissions inside a pass
//   PeerTable       peer_table.*            AV entries, refcounted by clients and accepted transfers
//   Poster          poster.*                credits, FI_MORE bursts, -FI_EAGAIN, reconnects
//   Registrar       registrar.*             local descriptors, the registration cache, MR closes
//   Segmenter       segmenter.*             transfers one post cannot carry: their lists, plans, posts
//   CqWatcher       ../progress/cq_watcher.hpp  the drain, fi_trywait, the fd, the backstop, the wait policy
//   Reclaimer       reclaimer.*             posted transfers the provider will not return by itself
//   Ledger          ledger.hpp              accepting, each transfer's one exit, deadlines, cancels
//   (sorting)       completion_error.*      what an error completion means for its transfer and peer
//   Shutdown        shutdown.hpp            the grace period, the flush, the close, the abandon
//   AddressHistory  address_history.hpp     every local address so far, the current one last
//   (protocols)     hosts.hpp               what the parts may call on the engine, as concepts
//
// The engine itself sets the parts up, wires them together, accepts transfers, and runs the passes:
// EngineImpl in engine_impl.hpp, its hot path compiled here (open_engine instantiates it), the rest
// in engine_slow_path.cpp.
#include "engine_impl.hpp"
#include "open_engine.hpp"

#include <rdma/fabric.h>

#include <asio/any_io_executor.hpp>
#include <asio/io_context.hpp>

#include <cstddef>
#include <memory>
#include <typeinfo>

namespace dma::detail {

// The public headers carry no libfabric type: PostContext's scratch stands in for fi_context2.
static_assert(sizeof(PostContext::provider_context) == sizeof(fi_context2) &&
              offsetof(PostContext, provider_context) == 0 && alignof(PostContext) >= alignof(fi_context2));

DrainPosition drain_position() noexcept {
  if (current_drain == nullptr) return DrainPosition::none;
  return *current_drain == DrainPlace::more ? DrainPosition::more : DrainPosition::last;
}

std::shared_ptr<Engine> open_engine(const asio::any_io_executor& executor, const Configuration& configuration,
                                    std::error_code& ec, std::string& what) {
  std::shared_ptr<Engine> engine;
  // An io_context's own executor gets an engine that calls it directly. Asio's
  // any_executor::target<T>() casts without checking the type (Asio 1.22), so the type is compared
  // first: a strand, a thread pool's executor or an io_context executor with other properties
  // takes the type-erased engine instead of being read as something it is not.
  if (executor.target_type() == typeid(asio::io_context::executor_type)) {
    auto direct = std::make_shared<EngineImpl<asio::io_context::executor_type>>(
        *executor.target<asio::io_context::executor_type>(), configuration);
    direct->open(ec, what);
    engine = std::move(direct);
  } else {
    auto erased = std::make_shared<EngineImpl<asio::any_io_executor>>(executor, configuration);
    erased->open(ec, what);
    engine = std::move(erased);
  }
  return ec ? nullptr : engine;
}

}  // namespace dma::detail
