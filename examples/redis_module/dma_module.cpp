// dma-module.so: DMA.HELLO, DMA.SET, DMA.GET and DMA.INFO (docs/side-channel.md) inside redis-server
// 7.0 and Valkey 8.1, on the callback layer. A DMA.SET or DMA.GET blocks its client and submits one
// transfer; the completer, on the fabric thread or a pool thread, only hands the completion to
// the main thread (UnblockClient, which takes no server lock). The key space is read and written,
// and the reply sent, in the reply callback on the main thread. What grows with the value stays
// off the main thread: a DMA.SET's value string is allocated and zero-filled by a value worker,
// which then submits the read, and memory only the module references is freed there too. See
// docs/redis-module.md.
#include <dma/dma.hpp>
#include <dma/kv/hello_bindings.hpp>
#include <dma/kv/protocol.hpp>

#include "copy_buffers.hpp"
#include "held_values.hpp"
#include "module_api.hpp"
#include "options.hpp"
#include "value_workers.hpp"

#include <pthread.h>
#include <sched.h>
#include <strings.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

using rm::api;
namespace errors = dma::kv::errors;
using Clock = std::chrono::steady_clock;

// DMA.SET values from this size on are held (HeldValues) so that DMA.GET can write from them;
// below it a copy costs less than the bookkeeping, and strings of up to 44 bytes are embedded,
// which StringSet copies anyway.
constexpr std::size_t hold_from = 16 << 10;

std::string_view view(const rm::String* s) {
  std::size_t length = 0;
  const char* p = api.StringPtrLen(s, &length);
  return {p, length};
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Raises `maximum` to `value` if it is larger; any thread.
void raise(std::atomic<std::int64_t>& maximum, std::int64_t value) {
  std::int64_t seen = maximum.load(std::memory_order_relaxed);
  while (value > seen && !maximum.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// One DMA.SET or DMA.GET from submission to its free callback. The main thread creates it and
// frees it; the fabric thread (and a pool thread, for the CRC) touch only `bytes` and `outcome`.
struct Transfer {
  rm::BlockedClient* blocked = nullptr;
  bool set = false;
  std::string key;
  /// DMA.SET: the string the value lands in, stored as it is. DMA.GET from a held value: one more
  /// reference to it, for as long as the write reads it.
  rm::String* value = nullptr;
  /// Whether `value`'s only reference is the transfer's (a DMA.SET value not stored, or one the
  /// server stored a copy of): then any thread may free it.
  bool value_private = false;
  /// DMA.SET: inside `value`. DMA.GET: inside `value`, or a copy (a CopyBuffers buffer).
  std::byte* bytes = nullptr;
  std::size_t length = 0;
  std::size_t copy_capacity = 0;  ///< DMA.GET from a copy: its buffer's size
  std::optional<std::uint32_t> expected_crc;
  std::optional<std::uint32_t> known_crc;  ///< DMA.GET from a held value: its CRC, not computed again
  std::optional<std::uint64_t> token;      ///< DMA.GET: the client's, sent as the write's immediate data
  /// DMA.GET from a copy: the client whose copy budget it counts in (its fabric address's bytes).
  std::optional<std::string> copy_owner;
  dma::Outcome outcome;
  std::int64_t completed_ns = 0;  ///< when the completer handed it over (steady clock)
};

// The transfer's context: the operand is the transfer's bytes.
struct Operation {
  Transfer* transfer = nullptr;
  std::span<const std::byte> source() const { return {transfer->bytes, transfer->length}; }
  std::span<std::byte> allocate(std::size_t n) const { return {transfer->bytes, std::min(n, transfer->length)}; }
};

using Service = dma::FabricService<Operation>;

// Counters read by DMA.INFO. The completer's are atomic; the rest change on the main thread only.
struct Counters {
  std::atomic<std::uint64_t> handed{0};  ///< completions handed to the main thread
  std::atomic<std::int64_t> completer_max_ns{0};
  std::atomic<std::int64_t> handoff_max_ns{0};  ///< completion to its reply or free callback
  std::uint64_t hellos = 0, hellos_rejected = 0, dma_clients = 0;
  std::uint64_t no_hello = 0;  ///< data commands whose client this server could not place (-NOHELLO)
  std::uint64_t sets_in_flight = 0, gets_in_flight = 0;
  std::uint64_t transfers_ok = 0, transfers_failed = 0, transfers_timed_out = 0, crc_mismatches = 0;
  std::uint64_t bytes_read = 0, bytes_written = 0;
  std::uint64_t gets_notified = 0;    ///< DMA.GET writes that carried the client's token
  std::uint64_t replies_dropped = 0;  ///< transfers whose client left before the reply
  std::uint64_t get_copies = 0, get_copy_ns = 0, get_copy_bytes = 0;
  std::uint64_t gets_from_held = 0;  ///< DMA.GETs written straight from a held value
  /// DMA.SET's value strings (zero-filled), allocated by the value workers.
  std::atomic<std::uint64_t> set_alloc_ns{0}, set_alloc_bytes{0};
  std::atomic<std::uint64_t> frees_off_main{0};  ///< values and copies freed by the value workers
  /// The main thread's time in the module, per part (steady clock, nanoseconds): the DMA.SET and
  /// DMA.GET command functions, their reply callbacks, the free callbacks of both, and inside the
  /// DMA.SET replies the store itself (StringSet: a copy of the value on Valkey 8.1).
  std::uint64_t set_calls = 0, set_command_ns = 0, set_reply_ns = 0, set_store_ns = 0;
  std::uint64_t get_calls = 0, get_command_ns = 0, get_reply_ns = 0;
  std::uint64_t release_ns = 0;
  std::uint64_t gets_refused_copy_limit = 0;  ///< a copy over get-copy-limit or the client's
  std::uint64_t gets_refused_oom = 0;         ///< a copy asked while the server is over maxmemory
  std::uint64_t sets_refused_paused = 0;      ///< completed while writes were paused: not stored
  std::uint64_t sets_refused_not_served = 0;  ///< completed after the key's slot left this node
  std::uint64_t sets_refused_cluster_down = 0;
};

// The references a held string has besides the key space's and the hold, main thread only: one
// for each DMA.GET writing from it. A string whose key and hold have let it go is orphaned: the
// reads' references are its last, and the last read to end frees it, off the main thread.
struct Readers {
  std::unordered_map<rm::String*, std::uint32_t> count;
  std::unordered_set<rm::String*> orphaned;
};

// The bytes DMA.GET copies hold until their writes end, in all and per client (one DMA.HELLO
// fabric address, whatever connections it uses). Main thread only.
struct GetCopies {
  std::uint64_t held = 0;
  std::unordered_map<std::string, std::uint64_t> by_client;
};

struct Module {
  dma_module::Options options;
  Counters counters;
  dma_module::HeldValues held{[](rm::String* s) { api.FreeString(nullptr, s); }};
  std::optional<bool> server_adopts;
  bool watching_keys = false;  ///< subscribed to keyspace events, from the first value held on
  std::shared_ptr<dma::Pool> pool;
  /// Allocates DMA.SET's value strings and submits their reads; frees what only the module
  /// references. Joined before the service stops, so every read it submits is accepted or refused.
  std::unique_ptr<dma_module::ValueWorkers> value_workers;
  bool wake_each_job = false;  ///< a server without the event-loop event
  /// DMA.GET writes submitted before the server sleeps: one wake-up of the fabric thread for all
  /// the DMA.GETs of an event-loop iteration.
  std::vector<std::pair<Transfer*, dma::TransferRequest<Operation>>> due;
  std::unique_ptr<Service> service;
  dma::EndpointInfo info;
  dma::kv::Confirmation confirmation = dma::kv::Confirmation::reply;  ///< what DMA.HELLO tells clients
  std::string address_hex;
  /// Connection id -> the binding its DMA.HELLO made (the connection holds it while open).
  std::unordered_map<std::uint64_t, dma::kv::Binding> peers;
  std::unique_ptr<dma::kv::HelloBindings> bindings;
  std::int64_t swept_ns = 0;    ///< when idle bindings were last dropped
  std::uint64_t maxmemory = 0;  ///< the server's: read at load and whenever CONFIG SET changes it
  GetCopies copies;
  std::unique_ptr<dma_module::CopyBuffers> copy_buffers;
  Readers readers;
  bool storing = false;  ///< the keyspace event under way is a DMA.SET's own, for the string it stored

  std::uint64_t copy_limit() const {
    return options.get_copy_limit.value_or(maxmemory != 0 ? std::max<std::uint64_t>(maxmemory / 8, 1)
                                                          : dma_module::default_get_copy_limit);
  }
  std::uint64_t copy_client_limit() const {
    return options.get_copy_client_limit.value_or(std::max<std::uint64_t>(copy_limit() / 4, 1));
  }
};

// Never destroyed by the process's exit: the service is stopped by the shutdown event (or unload),
// before the server exits, while its thread may still be running.
Module* module = nullptr;

// Puts the calling thread in SCHED_BATCH: a thread that wakes it (the main thread, submitting a
// transfer or handing a value worker a job) is not preempted by it and goes on; the kernel
// schedules it at the next tick instead. Every thread the main thread wakes is put so: the value
// workers as they start, the fabric thread and the pool's at their first completion.
void not_preempting() {
  const sched_param parameters{};
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &parameters);
}

void hand_over(std::span<dma::Completion<Operation>> batch) {
  thread_local const bool batch_policy = (not_preempting(), true);
  (void)batch_policy;
  const std::int64_t began = now_ns();
  for (auto& completion : batch) {
    Transfer* transfer = completion.caller_context.transfer;
    transfer->outcome = std::move(completion.outcome);
    transfer->completed_ns = began;
    api.UnblockClient(transfer->blocked, transfer);
  }
  auto& counters = module->counters;
  counters.handed.fetch_add(batch.size(), std::memory_order_relaxed);
  raise(counters.completer_max_ns, now_ns() - began);
}

int error(rm::Ctx* ctx, const std::string& text) { return api.ReplyWithError(ctx, text.c_str()); }

// Adds the time from its construction to its destruction to `total` (main-thread counters; the
// steady clock, as the server's own command statistics).
class Timed {
 public:
  explicit Timed(std::uint64_t& total) : total_(total), began_(now_ns()) {}
  ~Timed() { total_ += static_cast<std::uint64_t>(now_ns() - began_); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  std::uint64_t& total_;
  std::int64_t began_;
};

// Hands `job` to the value workers, which run it once the server is about to sleep (or at once, on
// a server without the event-loop event). False once they are closed (the module stopping).
bool post(dma_module::ValueWorkers::Job job) {
  if (!module->value_workers || !module->value_workers->post(std::move(job))) return false;
  if (module->wake_each_job) module->value_workers->wake();
  return true;
}

// Runs `job` on a value worker, or here once the workers are closed (the module stopping).
template <typename Job>
void off_main(Job job) {
  if (!post(job)) job();
}

// Frees memory that only the module references, off the main thread: freeing a large value
// returns its pages, which costs in proportion to its size.
void free_off_main(rm::String* value, std::byte* copy) {
  off_main([value, copy] {
    if (value != nullptr) api.FreeString(nullptr, value);
    std::free(copy);
    module->counters.frees_off_main.fetch_add(1, std::memory_order_relaxed);
  });
}

// Held references stay out of the way of eviction: a server that may evict counts the memory an
// eviction frees across the delete alone, and a held value is freed only later, by the evicted
// event, so it would evict more keys than it needs to. Such a server holds nothing. Nor does a
// provider that registers local operands (efa-direct): a DMA.GET would register key-space pages,
// which a fork-safe setup (FI_EFA_FORK_SAFE) hides from a BGSAVE child that reads them.
// `flags` are the context's (GetContextFlags), or read here when none are given.
bool may_hold(rm::Ctx* ctx, std::optional<int> flags = std::nullopt) {
  if (!module->options.hold_values || module->info.requires_local_mr) return false;
  if ((flags.value_or(api.GetContextFlags(ctx)) & rm::ctx_flags_evict) == 0) return true;
  module->held.clear();
  return false;
}

// Whether StringSet stores the very string it is given (redis-server 7.0) or a copy (Valkey 8.1),
// seen once, on the first value `name` was just set to. DMA.GET checks each value anyway.
bool server_adopts(rm::Ctx* ctx, rm::String* name, rm::String* value) {
  if (!module->server_adopts) {
    rm::Key* key = api.OpenKey(ctx, name, rm::read);
    std::size_t length = 0;
    const char* stored = key == nullptr ? nullptr : api.StringDMA(key, &length, rm::read);
    if (key != nullptr) api.CloseKey(key);
    module->server_adopts = stored == view(value).data();
  }
  return *module->server_adopts;
}

// Whether `key` holds `string` itself (not a copy of its bytes).
bool key_holds(rm::Ctx* ctx, rm::String* key, rm::String* string) {
  rm::Key* opened = api.OpenKey(ctx, key, rm::read | rm::open_key_notouch);
  if (opened == nullptr) return false;
  std::size_t length = 0;
  const char* stored = api.KeyType(opened) == rm::keytype_string ? api.StringDMA(opened, &length, rm::read) : nullptr;
  api.CloseKey(opened);
  return stored != nullptr && stored == view(string).data();
}

// Drops the module's hold on `string`, which `key` held until `event`. When no other reference
// can be left, the string is freed off the main thread (a large value's pages cost in proportion
// to its size to return). The key space may still hold it after RENAME or MOVE (under another
// name or database) or after an event that changed nothing; then the module's reference is one
// of several and is dropped here, which frees nothing. The DMA.GETs writing from it keep it until
// the last of them ends.
void let_go(rm::Ctx* ctx, const char* event, rm::String* key, rm::String* string) {
  const bool moved = std::strncmp(event, "rename_", 7) == 0 || std::strncmp(event, "move_", 5) == 0;
  if (moved || (!module->storing && key_holds(ctx, key, string))) return api.FreeString(nullptr, string);
  auto& readers = module->readers;
  if (!readers.count.contains(string)) return free_off_main(string, nullptr);
  readers.orphaned.insert(string);
  api.FreeString(nullptr, string);  // the reads' references remain
}

// A DMA.GET that wrote from a held string has ended: drops its reference.
void end_read(rm::String* string) {
  auto& readers = module->readers;
  if (const auto it = readers.count.find(string); it != readers.count.end() && --it->second == 0) {
    readers.count.erase(it);
    if (readers.orphaned.erase(string) != 0) return free_off_main(string, nullptr);  // the last reference
  }
  api.FreeString(nullptr, string);
}

// Any change to a key lets its held value go: APPEND and SETRANGE have copied it already, and
// DEL, overwrites, expiry, eviction and RENAME have dropped the key's reference, so the module's
// would only keep old bytes alive. A TTL change leaves the value as it is.
int key_changed(rm::Ctx* ctx, int, const char* event, rm::String* key) {
  if (module == nullptr || module->held.count() == 0) return rm::ok;
  if (std::strcmp(event, "expire") == 0 || std::strcmp(event, "persist") == 0) return rm::ok;
  if (auto held = module->held.take(api.GetSelectedDb(ctx), view(key))) let_go(ctx, event, key, held->string);
  return rm::ok;
}

// FLUSHDB, FLUSHALL, DEBUG RELOAD and a replica's full sync empty databases without a key event.
void flushing(rm::Ctx*, rm::Event, std::uint64_t subevent, void* data) {
  if (module == nullptr || subevent != rm::subevent_flushdb_start) return;
  module->held.release_db(static_cast<const rm::FlushInfo*>(data)->dbnum);
}

void swapping(rm::Ctx*, rm::Event, std::uint64_t, void* data) {
  if (module == nullptr) return;
  const auto* info = static_cast<const rm::SwapDbInfo*>(data);
  module->held.swap_dbs(info->dbnum_first, info->dbnum_second);
}

// After a DMA.SET stored its string: the module keeps the transfer's reference to it. The
// keyspace events that let it go are subscribed to with the first value held, so a server whose
// module holds nothing runs no callback on its writes.
void hold(rm::Ctx* ctx, int flags, rm::String* name, Transfer& transfer, std::uint32_t crc) {
  if (transfer.length < hold_from || !may_hold(ctx, flags) || !server_adopts(ctx, name, transfer.value)) return;
  if (!module->watching_keys) {
    api.SubscribeToKeyspaceEvents(ctx, rm::notify_all, key_changed);
    module->watching_keys = true;
  }
  module->held.hold(api.GetSelectedDb(ctx), view(name), {std::exchange(transfer.value, nullptr), transfer.length, crc});
}

// The held value of `key` if the key still holds it (`stored` is the key's bytes: the same bytes
// are the same string, which the module's reference keeps alive and unchanged), retained once more
// for a transfer; null otherwise, and a value the key no longer holds is let go.
const dma_module::HeldValues::Value* held_for(rm::Ctx* ctx, rm::String* key, const char* stored) {
  if (module->held.count() == 0 || !may_hold(ctx)) return nullptr;
  const int db = api.GetSelectedDb(ctx);
  const auto* held = module->held.find(db, view(key));
  if (held == nullptr) return nullptr;
  if (view(held->string).data() != stored) {
    module->held.release(db, view(key));
    return nullptr;
  }
  api.RetainString(nullptr, held->string);
  ++module->readers.count[held->string];
  return held;
}

// Why a completed DMA.SET may not store its value now, as the error its client gets; empty when it
// may. While writes are paused (CLIENT PAUSE WRITE, a manual failover, the shutdown wait) nothing
// may be written or replicated: the server aborts on a replicated write then. In a cluster the key's
// slot may have moved during the transfer, and a blocked client is not redirected when it does:
// the server's own routing decides, run through Call for EXISTS key with the client's READONLY
// and ASKING flags (a slot now owned elsewhere, or migrating with the key gone, fails with EPERM).
std::string commit_refusal(rm::Ctx* ctx, int flags, rm::String* key) {
  auto& counters = module->counters;
  if (api.AvoidReplicaTraffic() != 0) {
    ++counters.sets_refused_paused;
    return errors::writes_paused();
  }
  if ((flags & rm::ctx_flags_cluster) == 0) return {};
  errno = 0;
  rm::CallReply* probe = api.Call(ctx, "EXISTS", "s", key);
  if (probe != nullptr) {
    api.FreeCallReply(probe);
    return {};
  }
  if (errno == ENETDOWN || errno == EROFS) {
    ++counters.sets_refused_cluster_down;
    return errors::cluster_down();
  }
  ++counters.sets_refused_not_served;
  return errors::slot_moved();
}

// A transfer's reply, on the main thread, when its client is still connected: stores a DMA.SET's
// value and answers.
int reply(rm::Ctx* ctx, rm::String**, int) {
  auto* transfer = static_cast<Transfer*>(api.GetBlockedClientPrivateData(ctx));
  auto& counters = module->counters;
  const Timed timed(transfer->set ? counters.set_reply_ns : counters.get_reply_ns);
  const auto& outcome = transfer->outcome;
  if (!outcome) return error(ctx, errors::transfer_failed(outcome.message()));
  const std::uint32_t crc = transfer->known_crc.value_or(outcome->checksum.value_or(0));
  if (!transfer->set) {
    api.ReplyWithArray(ctx, 2);
    api.ReplyWithLongLong(ctx, static_cast<long long>(transfer->length));
    return api.ReplyWithLongLong(ctx, crc);
  }
  if (transfer->expected_crc && *transfer->expected_crc != crc) {
    ++counters.crc_mismatches;
    return error(ctx, errors::crc_mismatch(*transfer->expected_crc));
  }
  rm::String* name = api.CreateString(ctx, transfer->key.data(), transfer->key.size());
  const int flags = api.GetContextFlags(ctx);
  if (const std::string refusal = commit_refusal(ctx, flags, name); !refusal.empty()) {
    api.FreeString(ctx, name);
    return error(ctx, refusal);  // release() frees the value
  }
  {
    const Timed storing(counters.set_store_ns);
    rm::Key* key = api.OpenKey(ctx, name, rm::write);
    api.StringSet(key, transfer->value);
    api.CloseKey(key);
  }
  transfer->value_private = !server_adopts(ctx, name, transfer->value);
  module->storing = true;  // the key holds the new string: what was held for it went with the old
  api.NotifyKeyspaceEvent(ctx, rm::notify_string, "set", name);
  module->storing = false;
  api.Replicate(ctx, "SET", "ss", name, transfer->value);
  hold(ctx, flags, name, *transfer, crc);
  api.FreeString(ctx, name);
  return api.ReplyWithSimpleString(ctx, "OK");
}

// Always runs, once per transfer, on the main thread, whether the client is there or not.
void release(rm::Ctx*, void* data) {
  auto* transfer = static_cast<Transfer*>(data);
  auto& counters = module->counters;
  const Timed timed(counters.release_ns);
  raise(counters.handoff_max_ns, now_ns() - transfer->completed_ns);
  if (transfer->outcome) {
    ++counters.transfers_ok;
    (transfer->set ? counters.bytes_read : counters.bytes_written) += transfer->length;
    if (transfer->token) ++counters.gets_notified;
  } else {
    ++counters.transfers_failed;
    if (transfer->outcome.error() == std::errc::timed_out) ++counters.transfers_timed_out;
  }
  --(transfer->set ? counters.sets_in_flight : counters.gets_in_flight);
  if (transfer->value != nullptr && transfer->value_private) {
    free_off_main(transfer->value, nullptr);
  } else if (transfer->value != nullptr && !transfer->set) {
    end_read(transfer->value);
  } else if (transfer->value != nullptr) {
    api.FreeString(nullptr, transfer->value);  // shared with the key space: main thread only
  } else if (!transfer->set && transfer->bytes != nullptr) {
    for (const auto& gone : module->copy_buffers->give({transfer->bytes, transfer->copy_capacity}))
      free_off_main(nullptr, gone.data);
  }
  if (transfer->copy_owner) {
    auto& copies = module->copies;
    copies.held -= transfer->copy_capacity;
    const auto it = copies.by_client.find(*transfer->copy_owner);
    if (it != copies.by_client.end() && (it->second -= transfer->copy_capacity) == 0) copies.by_client.erase(it);
  }
  delete transfer;
}

void client_left(rm::Ctx*, rm::BlockedClient*) { ++module->counters.replies_dropped; }

// Hands a transfer the module is stopping for back to its client, failed; any thread.
void refuse(Transfer* transfer) {
  transfer->outcome = dma::Outcome(dma::make_error_code(dma::errc::shutdown));
  transfer->completed_ns = now_ns();
  api.UnblockClient(transfer->blocked, transfer);
}

// Submits a transfer whose client is blocked; any thread. A refused one is handed back failed.
void submit(Transfer* transfer, dma::TransferRequest<Operation> request) {
  if (module->service->submit(std::move(request))) refuse(transfer);
}

// A DMA.SET's value string, on a value worker: one the server allocates (so it counts in
// used_memory and maxmemory from here on), zero-filled (a value never holds bytes the process had
// before), which the read fills and the reply stores; then the read is submitted.
void allocate_and_submit(Transfer* transfer, dma::TransferRequest<Operation> request) {
  const std::int64_t began = now_ns();
  transfer->value = api.CreateString(nullptr, nullptr, transfer->length);
  transfer->value_private = true;
  // Written before anyone else sees the string: it is stored only after the read completed.
  transfer->bytes = reinterpret_cast<std::byte*>(const_cast<char*>(view(transfer->value).data()));
  auto& counters = module->counters;
  counters.set_alloc_ns.fetch_add(static_cast<std::uint64_t>(now_ns() - began), std::memory_order_relaxed);
  counters.set_alloc_bytes.fetch_add(transfer->length, std::memory_order_relaxed);
  submit(transfer, std::move(request));
}

// Blocks the client and submits (a DMA.SET through a value worker, which allocates its value
// first); the completer unblocks it.
void start(rm::Ctx* ctx, Transfer* transfer, const dma::kv::Binding& peer, std::uint64_t rkey, std::uint64_t address) {
  auto& counters = module->counters;
  ++(transfer->set ? counters.sets_in_flight : counters.gets_in_flight);
  transfer->blocked = api.BlockClient(ctx, reply, nullptr, release, 0);
  api.SetDisconnectCallback(transfer->blocked, client_left);
  dma::TransferRequest<Operation> request;
  request.client_id = peer.id;
  request.peer_address = peer.address;
  request.remote_key = rkey;
  request.remote_address = address;
  request.direction = transfer->set ? dma::Direction::FromPeer : dma::Direction::ToPeer;
  request.length = transfer->length;
  request.want_checksum = !transfer->known_crc;
  request.immediate_data = transfer->token;  // the client's Target hears it once the bytes have landed
  request.caller_context = Operation{transfer};
  if (!transfer->set && module->wake_each_job) return submit(transfer, std::move(request));
  if (!transfer->set) return module->due.emplace_back(transfer, std::move(request)), void();
  // A job the workers refuse (closed: the module stopping) runs here, and its read is refused.
  auto job = [transfer, request = std::move(request)]() mutable { allocate_and_submit(transfer, std::move(request)); };
  if (!post(std::move(job))) refuse(transfer);
}

// The client a data command is for: the binding its `CLIENT <token>` names, or the one this
// connection's DMA.HELLO made; nullopt after replying an error.
std::optional<dma::kv::Binding> client_of(rm::Ctx* ctx, std::string_view command,
                                          std::optional<std::string_view> named) {
  if (!module->service) {
    error(ctx, errors::shutting_down());
    return std::nullopt;
  }
  std::optional<dma::kv::Binding> binding;
  if (named) {
    const auto own = module->peers.find(api.GetClientId(ctx));
    binding = module->bindings->find(*named, own == module->peers.end() ? 0 : own->second.id);
  } else if (const auto it = module->peers.find(api.GetClientId(ctx)); it != module->peers.end()) {
    binding = it->second;
    module->bindings->touch(binding->id);
  }
  if (!binding) {
    ++module->counters.no_hello;
    error(ctx, errors::no_hello(named));
    return std::nullopt;
  }
  if (api.GetContextFlags(ctx) & rm::ctx_flags_deny_blocking) {
    error(ctx, errors::cannot_block(command));
    return std::nullopt;
  }
  return binding;
}

// Drops the bindings left idle (at most once a second; from the server's cron and each HELLO).
void sweep_bindings() {
  if (module == nullptr || !module->bindings) return;
  const std::int64_t now = now_ns();
  if (now - module->swept_ns < 1'000'000'000) return;
  module->swept_ns = now;
  for (const std::uint64_t id : module->bindings->sweep()) {
    if (module->service) module->service->remove_peer(id);
  }
}

// A command's arguments as views, its name included.
std::vector<std::string_view> views(rm::String** argv, int argc) {
  std::vector<std::string_view> arguments;
  arguments.reserve(static_cast<std::size_t>(argc));
  for (int i = 0; i < argc; ++i)
    arguments.push_back(view(argv[i]));
  return arguments;
}

int hello(rm::Ctx* ctx, rm::String** argv, int argc) {
  auto& counters = module->counters;
  const auto request = dma::kv::parse_hello(views(argv, argc), module->info.addr_format);
  if (!request.error.empty()) {
    if (argc == 2) ++counters.hellos_rejected;
    return error(ctx, request.error);
  }
  if (!module->service) return error(ctx, errors::shutting_down());
  const std::uint64_t id = api.GetClientId(ctx);
  if (module->peers.contains(id)) return error(ctx, errors::hello_repeated());
  auto reject = [&](const std::string& why) {
    ++counters.hellos_rejected;
    return error(ctx, errors::invalid_fabric_address(why));
  };
  const auto& address = request.address;
  if (!module->options.allow_any_fabric_host) {
    rm::ClientInfo client;
    if (api.GetClientInfoById(&client, id) != rm::ok) return reject("the connection's own address is unknown");
    if (client.flags & rm::clientinfo_flag_unixsocket) return reject("a unix-socket connection names no host");
    if (auto why = dma::kv::check_same_host(address, module->info.addr_format, client.addr); !why.empty()) {
      return reject(why);
    }
  }
  sweep_bindings();
  std::vector<std::uint64_t> dropped;
  std::optional<dma::kv::Binding> binding;
  try {
    binding = module->bindings->bind(id, address, dropped);
  } catch (const std::system_error& e) {
    return error(ctx, errors::no_random(e.what()));
  }
  for (const std::uint64_t gone : dropped)
    module->service->remove_peer(gone);
  if (!binding) {
    ++counters.hellos_rejected;
    return error(ctx, errors::too_many_bindings("max-hello-bindings", module->options.max_hello_bindings));
  }
  std::error_code ec;
  module->service->add_peer(id, address, ec);  // a round trip to the fabric thread, once per client
  if (ec) {
    module->bindings->release(id);
    return reject("inserting it: " + ec.message());
  }
  module->peers.emplace(id, *binding);
  ++counters.hellos;
  ++counters.dma_clients;
  api.ReplyWithArray(ctx, 5);
  api.ReplyWithStringBuffer(ctx, module->address_hex.data(), module->address_hex.size());
  api.ReplyWithLongLong(ctx, static_cast<long long>(id));
  api.ReplyWithLongLong(ctx, static_cast<long long>(module->options.max_value));
  const auto confirmation = dma::kv::to_string(module->confirmation);
  api.ReplyWithStringBuffer(ctx, confirmation.data(), confirmation.size());
  return api.ReplyWithStringBuffer(ctx, binding->token.data(), binding->token.size());
}

int dma_set(rm::Ctx* ctx, rm::String** argv, int argc) {
  auto& counters = module->counters;
  ++counters.set_calls;
  const Timed timed(counters.set_command_ns);
  const auto request = dma::kv::parse_set(views(argv, argc), module->options.max_value);
  if (!request.error.empty()) return error(ctx, request.error);
  const auto peer = client_of(ctx, "DMA.SET", request.client);
  if (!peer) return rm::ok;
  const auto length = static_cast<std::size_t>(request.window.length);
  if (length == 0) {
    rm::String* value = api.CreateString(nullptr, nullptr, 0);
    rm::Key* key = api.OpenKey(ctx, argv[1], rm::write);
    api.StringSet(key, value);
    api.CloseKey(key);
    api.NotifyKeyspaceEvent(ctx, rm::notify_string, "set", argv[1]);
    api.Replicate(ctx, "SET", "ss", argv[1], value);
    api.FreeString(nullptr, value);
    return api.ReplyWithSimpleString(ctx, "OK");
  }
  auto* transfer = new Transfer;
  transfer->set = true;
  transfer->key = view(argv[1]);
  transfer->length = length;  // the value string is allocated off the main thread (start)
  transfer->expected_crc = request.crc;
  start(ctx, transfer, *peer, request.window.rkey, request.window.address);
  return rm::ok;
}

// Why a DMA.GET may not take a copy of `length` bytes for the client `owner` now, or "". A copy is
// memory held for as long as the client takes to receive it: refused, like any write, while the
// server is over maxmemory, and over the copy limits; a copy that is alone in its budget is
// always let through, so that any value stays readable.
std::string refuse_copy(const std::string& owner, std::size_t length) {
  auto& m = *module;
  if (m.maxmemory != 0 && api.GetUsedMemoryRatio() > 1.0F) {
    ++m.counters.gets_refused_oom;
    return errors::over_maxmemory();
  }
  const auto over = [&](std::uint64_t held, std::uint64_t limit) { return held != 0 && held + length > limit; };
  const auto it = m.copies.by_client.find(owner);
  const std::uint64_t own = it == m.copies.by_client.end() ? 0 : it->second;
  std::string why;
  if (over(m.copies.held, m.copy_limit())) {
    why = errors::copy_limit(m.copies.held, length, m.copy_limit());
  } else if (over(own, m.copy_client_limit())) {
    why = errors::client_copy_limit(own, length, m.copy_client_limit());
  }
  if (!why.empty()) ++m.counters.gets_refused_copy_limit;
  return why;
}

int dma_get(rm::Ctx* ctx, rm::String** argv, int argc) {
  ++module->counters.get_calls;
  const Timed timed(module->counters.get_command_ns);
  const auto request = dma::kv::parse_get(views(argv, argc));
  if (!request.error.empty()) return error(ctx, request.error);
  const auto peer = client_of(ctx, "DMA.GET", request.client);
  if (!peer) return rm::ok;
  const auto window = &request.window;
  const auto token = request.token;
  rm::Key* key = api.OpenKey(ctx, argv[1], rm::read);
  if (key == nullptr || api.KeyType(key) == rm::keytype_empty) {
    if (key != nullptr) api.CloseKey(key);
    return error(ctx, errors::no_such_key());
  }
  if (api.KeyType(key) != rm::keytype_string) {
    api.CloseKey(key);
    return error(ctx, errors::wrong_type());
  }
  std::size_t length = 0;
  const char* stored = api.StringDMA(key, &length, rm::read);
  if (length > window->length) {
    api.CloseKey(key);
    return error(ctx, errors::buffer_too_small(length, window->length));
  }
  if (length == 0) {
    api.CloseKey(key);
    api.ReplyWithArray(ctx, 2);
    api.ReplyWithLongLong(ctx, 0);
    return api.ReplyWithLongLong(ctx, 0);
  }
  auto& counters = module->counters;
  if (const auto* held = held_for(ctx, argv[1], stored)) {
    api.CloseKey(key);
    ++counters.gets_from_held;
    auto* transfer = new Transfer;
    transfer->key = view(argv[1]);
    transfer->value = held->string;
    transfer->bytes = reinterpret_cast<std::byte*>(const_cast<char*>(stored));  // only read
    transfer->length = length;
    transfer->known_crc = held->crc;
    transfer->token = token;
    start(ctx, transfer, *peer, window->rkey, window->address);
    return rm::ok;
  }
  // Any other value may change in place (APPEND, SETRANGE) or go (DEL) once this command
  // returns, and Redis 7.0 has no call that holds a key's value: the transfer writes from a copy.
  // The copy is the module's memory, not the server's (std::malloc, outside used_memory): it
  // lives as long as the client takes, which the server's eviction cannot shorten, so counting
  // it there would make the server evict keys to make room for memory it cannot free. The copy
  // limits bound it instead.
  std::string owner(reinterpret_cast<const char*>(peer->address.data()), peer->address.size());
  if (auto why = refuse_copy(owner, length); !why.empty()) {
    api.CloseKey(key);
    return error(ctx, why);
  }
  const std::int64_t began = now_ns();
  const auto copy = module->copy_buffers->take(length, Clock::now());
  if (copy.data == nullptr) {
    api.CloseKey(key);
    return error(ctx, errors::copy_out_of_memory(length));
  }
  std::memcpy(copy.data, stored, length);
  api.CloseKey(key);
  counters.get_copy_ns += static_cast<std::uint64_t>(now_ns() - began);
  counters.get_copy_bytes += length;
  ++counters.get_copies;
  module->copies.held += copy.capacity;
  module->copies.by_client[owner] += copy.capacity;
  auto* transfer = new Transfer;
  transfer->key = view(argv[1]);
  transfer->bytes = copy.data;
  transfer->length = length;
  transfer->copy_capacity = copy.capacity;
  transfer->token = token;
  transfer->copy_owner = std::move(owner);
  start(ctx, transfer, *peer, window->rkey, window->address);
  return rm::ok;
}

std::string info_text() {
  const auto& c = module->counters;
  dma::kv::InfoFields fields;
  fields.server = "dma-module";
  fields.provider = module->info.provider;
  fields.fabric_address = module->address_hex;
  fields.any_fabric_host = module->options.allow_any_fabric_host;
  fields.max_value = module->options.max_value;
  fields.confirmation = module->confirmation;
  fields.dma_clients = c.dma_clients;
  fields.hellos = c.hellos;
  fields.hellos_rejected = c.hellos_rejected;
  fields.hello_bindings = module->bindings ? module->bindings->size() : 0;
  fields.hello_bindings_dropped = module->bindings ? module->bindings->dropped() : 0;
  fields.no_hello = c.no_hello;
  fields.outstanding = module->service ? module->service->outstanding() : 0;
  fields.sets_in_flight = c.sets_in_flight;
  fields.gets_in_flight = c.gets_in_flight;
  fields.transfers_ok = c.transfers_ok;
  fields.transfers_failed = c.transfers_failed;
  fields.transfers_timed_out = c.transfers_timed_out;
  fields.crc_mismatches = c.crc_mismatches;
  fields.bytes_read = c.bytes_read;
  fields.bytes_written = c.bytes_written;
  fields.gets_notified = c.gets_notified;
  if (module->service) fields.service = module->service->metrics();
  using Section = dma::kv::InfoSection;
  return dma::kv::info_text(fields, [&](Section section, dma::kv::InfoText& t) {
    if (section == Section::server) {
      t.field("maxmemory", module->maxmemory);
    } else if (section == Section::transfers) {
      t.field("replies_dropped", c.replies_dropped);
      t.field("get_copies", c.get_copies);
      t.field("get_copy_bytes", c.get_copy_bytes);
      t.field("get_copy_us", c.get_copy_ns / 1000);
      t.field("get_copies_held_bytes", module->copies.held);
      t.field("get_copy_buffers_kept_bytes", module->copy_buffers->kept_bytes());
      t.field("get_copy_buffers_reused", module->copy_buffers->reused());
      t.field("get_copy_limit", module->copy_limit());
      t.field("get_copy_client_limit", module->copy_client_limit());
      t.field("gets_refused_copy_limit", c.gets_refused_copy_limit);
      t.field("gets_refused_oom", c.gets_refused_oom);
      t.field("sets_refused_paused", c.sets_refused_paused);
      t.field("sets_refused_not_served", c.sets_refused_not_served);
      t.field("sets_refused_cluster_down", c.sets_refused_cluster_down);
      t.field("gets_from_held", c.gets_from_held);
      t.field("held_values", module->held.count());
      t.field("held_bytes", module->held.bytes());
      t.field("set_alloc_bytes", c.set_alloc_bytes.load(std::memory_order_relaxed));
      t.field("set_alloc_us", c.set_alloc_ns.load(std::memory_order_relaxed) / 1000);
      t.field("frees_off_main", c.frees_off_main.load(std::memory_order_relaxed));
      t.field("completions_handed", c.handed.load(std::memory_order_relaxed));
      t.field("completer_max_us",
              static_cast<std::uint64_t>(c.completer_max_ns.load(std::memory_order_relaxed) / 1000));
      t.field("handoff_max_us", static_cast<std::uint64_t>(c.handoff_max_ns.load(std::memory_order_relaxed) / 1000));
    } else if (section == Section::commands) {
      t.field("set_calls", c.set_calls);
      t.field("set_command_us", c.set_command_ns / 1000);
      t.field("set_reply_us", c.set_reply_ns / 1000);
      t.field("set_store_us", c.set_store_ns / 1000);
      t.field("get_calls", c.get_calls);
      t.field("get_command_us", c.get_command_ns / 1000);
      t.field("get_reply_us", c.get_reply_ns / 1000);
      t.field("release_us", c.release_ns / 1000);
      const std::uint64_t total = c.set_command_ns + c.set_reply_ns + c.get_command_ns + c.get_reply_ns + c.release_ns;
      t.field("main_thread_us", total / 1000);
    } else if (section == Section::service) {
      t.field("completer_failures", module->service->completer_failures());
    }
  });
}

int dma_info(rm::Ctx* ctx, rm::String** argv, int argc) {
  if (!dma::kv::arity_fits(dma::kv::info_command, static_cast<std::size_t>(argc))) {
    return error(ctx, errors::wrong_arity(view(argv[0])));
  }
  const std::string text = info_text();
  return api.ReplyWithStringBuffer(ctx, text.data(), text.size());
}

bool busy() {
  const auto& c = module->counters;
  return c.sets_in_flight + c.gets_in_flight > 0 || (module->service && module->service->outstanding() > 0);
}

// Submits the DMA.GET writes of this event-loop iteration and wakes the value worker its jobs went
// to: the main thread wakes each thread once per iteration at most.
void hand_over_iteration() {
  for (auto& [transfer, request] : std::exchange(module->due, {}))
    submit(transfer, std::move(request));
  if (module->value_workers) module->value_workers->wake();
}

// Stops the service: posted transfers finish (bounded by the progress deadline) and every
// completion reaches the completer before this returns.
void stop() {
  if (module->service) hand_over_iteration();
  if (module->value_workers) module->value_workers->join();  // its reads reach the service first
  module->service.reset();
  if (module->pool) module->pool->join();
  module->held.clear();
}

void client_changed(rm::Ctx*, rm::Event, std::uint64_t subevent, void* data) {
  if (subevent != rm::subevent_client_disconnected || module == nullptr) return;
  const auto* client = static_cast<const rm::ClientInfo*>(data);
  const auto it = module->peers.find(client->id);
  if (it == module->peers.end()) return;
  // Shared with the client's other connections, its binding stays until left idle.
  if (module->bindings->release(it->second.id) && module->service) module->service->remove_peer(it->second.id);
  module->peers.erase(it);
  --module->counters.dma_clients;
}

// Lets the kept copy buffers go once no DMA.GET has taken a copy for 10 s.
void release_idle_copy_buffers() {
  auto& buffers = *module->copy_buffers;
  if (buffers.kept_bytes() == 0 || Clock::now() - buffers.last_taken() < std::chrono::seconds(10)) return;
  for (const auto& buffer : buffers.drain())
    free_off_main(nullptr, buffer.data);
}

void cron(rm::Ctx*, rm::Event, std::uint64_t, void*) {
  sweep_bindings();
  if (module != nullptr) release_idle_copy_buffers();
}

void before_sleep(rm::Ctx*, rm::Event, std::uint64_t subevent, void*) {
  if (module != nullptr && subevent == rm::subevent_before_sleep) hand_over_iteration();
}

// The server's maxmemory, which sets the default DMA.GET copy limits.
void read_maxmemory(rm::Ctx* ctx) {
  rm::ServerInfoData* info = api.GetServerInfo(ctx, "memory");
  if (info == nullptr) return;
  int failed = 0;
  const unsigned long long value = api.ServerInfoGetFieldUnsigned(info, "maxmemory", &failed);
  if (failed == rm::ok) module->maxmemory = value;
  api.FreeServerInfo(ctx, info);
}

void config_changed(rm::Ctx* ctx, rm::Event, std::uint64_t subevent, void* data) {
  if (module == nullptr || subevent != 0 || data == nullptr) return;
  const auto* change = static_cast<const rm::ConfigChange*>(data);
  for (std::uint32_t i = 0; i < change->num_changes; ++i) {
    if (change->config_names[i] != nullptr && strcasecmp(change->config_names[i], "maxmemory") == 0) {
      return read_maxmemory(ctx);
    }
  }
}

void shutting_down(rm::Ctx*, rm::Event, std::uint64_t, void*) {
  if (module != nullptr) stop();
}

int load(rm::Ctx* ctx, rm::String** argv, int argc) {
  std::vector<std::string_view> arguments;
  for (int i = 0; i < argc; ++i)
    arguments.push_back(view(argv[i]));
  auto loaded = std::make_unique<Module>();
  if (auto why = dma_module::parse_options(arguments, loaded->options); !why.empty()) {
    api.Log(ctx, "warning", "dma: %s", why.c_str());
    return rm::err;
  }
  loaded->copy_buffers = std::make_unique<dma_module::CopyBuffers>(loaded->options.get_copy_cache);
  loaded->bindings = std::make_unique<dma::kv::HelloBindings>(dma::kv::HelloBindings::Limits{
      loaded->options.max_hello_bindings, std::chrono::seconds(loaded->options.hello_idle_seconds)});
  try {
    const auto configuration = loaded->options.configuration();
    if (loaded->options.pool_threads > 0) loaded->pool = std::make_shared<dma::Pool>(loaded->options.pool_threads);
    loaded->value_workers = std::make_unique<dma_module::ValueWorkers>(
        std::max<std::size_t>(loaded->options.pool_threads, 1), "dma-value", not_preempting);
    module = loaded.get();  // the completer reads the counters through it
    loaded->service = Service::start(configuration, hand_over, loaded->pool);
  } catch (const std::exception& e) {
    module = nullptr;
    api.Log(ctx, "warning", "dma: starting the fabric service: %s", e.what());
    return rm::err;
  }
  loaded->info = loaded->service->describe();
  loaded->confirmation = dma::kv::resolve_confirmation(loaded->options.confirm_gets, loaded->info);
  if (auto why = dma::kv::check_token_room(loaded->info);
      !why.empty() && loaded->confirmation == dma::kv::Confirmation::notification) {
    api.Log(ctx, "warning", "dma: confirm-gets notification: %s", why.c_str());
    stop();
    module = nullptr;
    return rm::err;
  }
  loaded->address_hex = dma::encode_hex(loaded->service->local_address());
  module = loaded.release();
  // DMA.SET overwrites its key as SET does, DMA.GET reads and returns it as GET does: ACL key
  // patterns (%R~, %W~), COMMAND GETKEYS and READONLY replicas see them so.
  const std::pair<const dma::kv::Command*, rm::CmdFunc> commands[] = {{&dma::kv::hello_command, hello},
                                                                      {&dma::kv::set_command, dma_set},
                                                                      {&dma::kv::get_command, dma_get},
                                                                      {&dma::kv::info_command, dma_info}};
  for (const auto& [command, function] : commands) {
    std::string name(command->name);
    for (auto& ch : name)
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const std::string flags(command->flags);
    const int key = command->key_position;
    const std::uint64_t key_flags = key == 0              ? 0
                                    : command->writes_key ? rm::key_ow | rm::key_update
                                                          : rm::key_ro | rm::key_access;
    const std::string summary(command->summary);
    const bool created = api.CreateCommand(ctx, name.c_str(), function, flags.c_str(), key, key, key) == rm::ok;
    if (!created ||
        (key_flags != 0 && !rm::describe_single_key_command(ctx, name.c_str(), summary.c_str(),
                                                            -static_cast<int>(command->min_args), key_flags))) {
      api.Log(ctx, "warning", "dma: creating the command %s", name.c_str());
      stop();
      delete std::exchange(module, nullptr);
      return rm::err;
    }
  }
  api.SubscribeToServerEvent(ctx, rm::event_client_change, client_changed);
  api.SubscribeToServerEvent(ctx, rm::event_shutdown, shutting_down);
  api.SubscribeToServerEvent(ctx, rm::event_flushdb, flushing);
  api.SubscribeToServerEvent(ctx, rm::event_swapdb, swapping);
  api.SubscribeToServerEvent(ctx, rm::event_config, config_changed);
  api.SubscribeToServerEvent(ctx, rm::event_cron_loop, cron);
  if (api.SubscribeToServerEvent(ctx, rm::event_loop, before_sleep) != rm::ok) {
    api.Log(ctx, "warning", "dma: the server has no event-loop event: the value workers are woken for each job");
    module->wake_each_job = true;
  }
  read_maxmemory(ctx);
  api.Log(ctx, "notice", "dma: fabric %s, address %s, max-value %zu, DMA.GET confirmed by %s",
          module->info.provider.c_str(), module->address_hex.c_str(),
          static_cast<std::size_t>(module->options.max_value),
          std::string(dma::kv::to_string(module->confirmation)).c_str());
  return rm::ok;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int RedisModule_OnLoad(rm::Ctx* ctx, rm::String** argv, int argc) {
  const char* missing = nullptr;
  if (!rm::bind(ctx, &missing)) return rm::err;  // no Log without the API: the server says the load failed
  if (api.IsModuleNameBusy("dma")) return rm::err;
  api.SetModuleAttribs(ctx, "dma", 1, rm::api_version_1);
  return load(ctx, argv, argc);
}

// Refused while a transfer is in flight: its completion would call into unloaded code.
extern "C" __attribute__((visibility("default"))) int RedisModule_OnUnload(rm::Ctx* ctx) {
  if (module == nullptr) return rm::ok;
  if (busy()) {
    api.Log(ctx, "warning", "dma: not unloading with transfers in flight");
    return rm::err;
  }
  stop();
  delete std::exchange(module, nullptr);
  return rm::ok;
}
