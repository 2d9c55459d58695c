#include "rails.hpp"

#include "open_engine.hpp"

#include <dma/error.hpp>

#include <algorithm>
#include <array>
#include <utility>

namespace dma::detail {

std::shared_ptr<Engine> Engine::create(const asio::any_io_executor& executor, const Configuration& configuration,
                                       std::error_code& ec, std::string& what) {
  if (configuration.endpoints == 0 || configuration.endpoints > max_endpoints) {
    ec = errc::invalid_configuration;
    what =
        "endpoints must be 1 to " + std::to_string(max_endpoints) + ", not " + std::to_string(configuration.endpoints);
    return nullptr;
  }
  if (configuration.endpoints == 1) return open_engine(executor, configuration, ec, what);
  return Rails::open(executor, configuration, ec, what);
}

std::shared_ptr<Rails> Rails::open(const asio::any_io_executor& executor, const Configuration& configuration,
                                   std::error_code& ec, std::string& what) {
  std::vector<std::shared_ptr<Engine>> rails;
  for (std::size_t k = 0; k < configuration.endpoints; ++k) {
    auto engine = open_engine(executor, rail_configuration(configuration, k), ec, what);
    if (!engine) {
      std::string prefix = "endpoint ";
      prefix += std::to_string(k);
      prefix += ": ";
      what.insert(0, prefix);
      for (auto& opened : rails)
        opened->shutdown();
      return nullptr;
    }
    rails.push_back(std::move(engine));
  }
  return std::make_shared<Rails>(std::move(rails), configuration);
}

Configuration Rails::rail_configuration(const Configuration& configuration, std::size_t k) {
  Configuration c = configuration;
  if (k == 0) return c;
  if (c.interfaces.size() > 1)
    std::rotate(c.interfaces.begin(), c.interfaces.begin() + static_cast<std::ptrdiff_t>(k % c.interfaces.size()),
                c.interfaces.end());
  c.port.reset();
  return c;
}

Rails::Rails(std::vector<std::shared_ptr<Engine>> rails, const Configuration& configuration)
    : rails_(std::move(rails)),
      configuration_(configuration),
      stripe_threshold_(std::max<std::size_t>(configuration.stripe_threshold, 1)) {}

// Resolves op's operand on the calling thread, and keeps the result for its engine's resolve().
errc Rails::resolve_here(Operation& op) {
  const errc error = op.functions->resolve(op);
  op.resolved_early = true;
  op.early_error = error;
  return error;
}

// The operand is resolved here, once, to tell whether the transfer is striped; one that is not
// takes what was resolved to its endpoint.
void Rails::submit(Operation* op) {
  const errc error = resolve_here(*op);
  if (error == errc{} && op->lists == 0 && op->length >= stripe_threshold_) {
    return StripeJoin::start(shared_from_this(), op, std::span<std::byte>(op->buffer, op->length), rails_.size());
  }
  least_loaded().submit(op);
}

// A write of no bytes from each endpoint, so that each connects.
void Rails::warm_up(Operation* op) {
  const errc error = resolve_here(*op);
  if (error != errc{}) return least_loaded().submit(op);  // it fails there, as any transfer would
  StripeJoin::start(shared_from_this(), op, std::span<std::byte>(), rails_.size());
}

// A striped transfer cancels its parts, for terminal or partial only: they are posted
// independently, so "no side effect" (total) cannot be promised for the whole. Any other
// transfer is on one endpoint, which finds it by address and sequence; the others find nothing.
void Rails::cancel(Operation* op, std::uint64_t sequence, CancelScope scope) {
  std::array<StripeJoin::Part, max_endpoints + 1> parts{};
  std::size_t count = 0;
  bool striped = false;
  {
    std::lock_guard lock(stripes_mutex_);
    for (const StripeJoin* join = stripes_; join != nullptr; join = join->older) {
      if (!join->is(op, sequence)) continue;
      striped = true;
      count = join->parts(parts);
      break;
    }
  }
  if (!striped) {
    for (const auto& engine : rails_)
      engine->cancel(op, sequence, scope);
    return;
  }
  if (scope != CancelScope::queued_or_posted) return;
  // A part not yet submitted (the held notifier) is not found by its engine: cancelling the
  // others fails the join, and the notifier is then never posted.
  for (std::size_t k = 0; k < count; ++k)
    rails_[parts[k].rail]->cancel(parts[k].op, parts[k].sequence, scope);
}

void Rails::enter(StripeJoin& join) noexcept {
  std::lock_guard lock(stripes_mutex_);
  join.older = stripes_;
  join.newer = nullptr;
  if (stripes_ != nullptr) stripes_->newer = &join;
  stripes_ = &join;
}

void Rails::leave(StripeJoin& join) noexcept {
  std::lock_guard lock(stripes_mutex_);
  if (join.newer != nullptr)
    join.newer->older = join.older;
  else
    stripes_ = join.older;
  if (join.older != nullptr) join.older->newer = join.newer;
  join.older = join.newer = nullptr;
}

// Every endpoint inserts it; the first error is the answer, once all have.
void Rails::insert_peer(std::uint64_t client_id, std::vector<std::uint8_t> address, Done done) {
  struct Fan {
    std::mutex mutex;
    std::size_t left = 0;
    std::error_code ec;
    Done done;
  };
  auto fan = std::make_shared<Fan>();
  fan->left = rails_.size();
  fan->done = std::move(done);
  for (const auto& engine : rails_) {
    engine->insert_peer(client_id, address, [fan](std::error_code ec) {
      std::unique_lock lock(fan->mutex);
      if (ec && !fan->ec) fan->ec = ec;
      if (--fan->left != 0) return;
      lock.unlock();
      fan->done(fan->ec);
    });
  }
}

// Pinned on every endpoint's domain in turn; the first error ends it.
void Rails::pin(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive, Done done) {
  pin_from(0, base, length, std::move(keep_alive), std::move(done));
}

void Rails::pin_from(std::size_t k, std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive,
                     Done done) {
  rails_[k]->pin(base, length, keep_alive,
                 [self = shared_from_this(), k, base, length, keep_alive, done](std::error_code ec) mutable {
                   if (!ec && k + 1 < self->rails_.size())
                     return self->pin_from(k + 1, base, length, std::move(keep_alive), std::move(done));
                   done(ec);
                 });
}

void Rails::remove_peer(std::uint64_t client_id) {
  for (const auto& engine : rails_)
    engine->remove_peer(client_id);
}

void Rails::shutdown() {
  for (const auto& engine : rails_)
    engine->shutdown();
}

std::size_t Rails::outstanding() const noexcept {
  std::size_t n = 0;
  for (const auto& engine : rails_)
    n += engine->outstanding();
  return n;
}

std::vector<std::vector<std::uint8_t>> Rails::endpoint_addresses() const {
  std::vector<std::vector<std::uint8_t>> addresses;
  addresses.reserve(rails_.size());
  for (const auto& engine : rails_)
    addresses.push_back(engine->local_address());
  return addresses;
}

Metrics Rails::metrics() const noexcept {
  Metrics m;
  for (const auto& engine : rails_)
    m += engine->metrics();
  return m;
}

Engine& Rails::least_loaded() const noexcept {
  Engine* best = rails_.front().get();
  std::size_t load = best->outstanding();
  for (std::size_t k = 1; k < rails_.size() && load != 0; ++k) {
    const std::size_t n = rails_[k]->outstanding();
    if (n < load) {
      best = rails_[k].get();
      load = n;
    }
  }
  return *best;
}

}  // namespace dma::detail
