// The part of the Redis module API (https://redis.io/docs/latest/develop/reference/modules/
// modules-api-ref/) this module calls, declared from its documentation. A server hands a module
// one lookup function, `RedisModule_GetApi`, in the first word of the context it passes to
// `RedisModule_OnLoad`; every other call is a function pointer obtained from it by name, as the
// documented `RedisModule_Init` does. Valkey registers each call under the same `RedisModule_`
// name, so one module loads in both servers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rm {

// Opaque handles: the server owns what they point to.
struct Ctx;
struct String;
struct Key;
struct BlockedClient;
struct ServerInfoData;

inline constexpr int ok = 0;
inline constexpr int err = 1;
inline constexpr int api_version_1 = 1;

/// OpenKey modes.
inline constexpr int read = 1 << 0;
inline constexpr int write = 1 << 1;

/// KeyType results.
inline constexpr int keytype_empty = 0;
inline constexpr int keytype_string = 1;

/// GetContextFlags bits.
inline constexpr int ctx_flags_lua = 1 << 0;
inline constexpr int ctx_flags_multi = 1 << 1;
inline constexpr int ctx_flags_evict = 1 << 9;  ///< maxmemory with a policy that may delete keys
inline constexpr int ctx_flags_deny_blocking = 1 << 21;

/// Keyspace event classes: NotifyKeyspaceEvent's type, SubscribeToKeyspaceEvents' mask.
inline constexpr int notify_string = 1 << 3;
/// Every class a key's value can change or go by (generic, the types, expired, evicted, stream,
/// module); not key-miss, loaded or new.
inline constexpr int notify_all = 0x27fc;

/// Server events (SubscribeToServerEvent).
struct Event {
  std::uint64_t id;
  std::uint64_t dataver;
};
inline constexpr Event event_flushdb{2, 1};
inline constexpr Event event_client_change{4, 1};
inline constexpr Event event_shutdown{5, 1};
inline constexpr Event event_swapdb{11, 1};
inline constexpr Event event_config{16, 1};
inline constexpr std::uint64_t subevent_client_disconnected = 1;
inline constexpr std::uint64_t subevent_flushdb_start = 0;

/// What the flushdb event passes: the database emptied, -1 for all.
struct FlushInfo {
  std::uint64_t version;
  std::int32_t sync;
  std::int32_t dbnum;
};

/// What the config event passes (subevent 0: changed): the names of the settings changed.
struct ConfigChange {
  std::uint64_t version;
  std::uint32_t num_changes;
  const char** config_names;
};

/// What the swapdb event passes.
struct SwapDbInfo {
  std::uint64_t version;
  std::int32_t dbnum_first;
  std::int32_t dbnum_second;
};

/// RedisModuleClientInfo, version 1: what GetClientInfoById fills and what the client-change event
/// passes as its data.
struct ClientInfo {
  std::uint64_t version = 1;
  std::uint64_t flags = 0;
  std::uint64_t id = 0;
  char addr[46] = {};
  std::uint16_t port = 0;
  std::uint16_t db = 0;
};
inline constexpr std::uint64_t clientinfo_flag_unixsocket = 1 << 4;

using CmdFunc = int (*)(Ctx*, String** argv, int argc);
using FreePrivdata = void (*)(Ctx*, void*);
using DisconnectFunc = void (*)(Ctx*, BlockedClient*);
using EventCallback = void (*)(Ctx*, Event, std::uint64_t subevent, void* data);
using NotificationFunc = int (*)(Ctx*, int type, const char* event, String* key);

/// The calls, filled by bind(). Names follow the API without its `RedisModule_` prefix.
struct Api {
  int (*GetApi)(const char*, void*);
  int (*IsModuleNameBusy)(const char*);
  void (*SetModuleAttribs)(Ctx*, const char* name, int version, int api_version);
  int (*CreateCommand)(Ctx*, const char* name, CmdFunc, const char* flags, int first_key, int last_key, int step);
  int (*SubscribeToServerEvent)(Ctx*, Event, EventCallback);
  int (*SubscribeToKeyspaceEvents)(Ctx*, int types, NotificationFunc);
  void (*Log)(Ctx*, const char* level, const char* format, ...);

  int (*WrongArity)(Ctx*);
  int (*ReplyWithError)(Ctx*, const char*);
  int (*ReplyWithSimpleString)(Ctx*, const char*);
  int (*ReplyWithLongLong)(Ctx*, long long);
  int (*ReplyWithArray)(Ctx*, long);
  int (*ReplyWithStringBuffer)(Ctx*, const char*, std::size_t);
  int (*GetContextFlags)(Ctx*);
  int (*GetSelectedDb)(Ctx*);

  String* (*CreateString)(Ctx*, const char*, std::size_t);
  void (*FreeString)(Ctx*, String*);
  void (*RetainString)(Ctx*, String*);
  const char* (*StringPtrLen)(const String*, std::size_t*);

  Key* (*OpenKey)(Ctx*, String*, int mode);
  void (*CloseKey)(Key*);
  int (*KeyType)(Key*);
  int (*StringSet)(Key*, String*);
  char* (*StringDMA)(Key*, std::size_t*, int mode);
  int (*NotifyKeyspaceEvent)(Ctx*, int type, const char* event, String* key);
  int (*Replicate)(Ctx*, const char* command, const char* format, ...);

  BlockedClient* (*BlockClient)(Ctx*, CmdFunc reply, CmdFunc timeout, FreePrivdata, long long timeout_ms);
  int (*UnblockClient)(BlockedClient*, void* privdata);
  void* (*GetBlockedClientPrivateData)(Ctx*);
  void (*SetDisconnectCallback)(BlockedClient*, DisconnectFunc);

  unsigned long long (*GetClientId)(Ctx*);
  int (*GetClientInfoById)(void* info, std::uint64_t id);

  void* (*Alloc)(std::size_t);
  void (*Free)(void*);

  /// Used memory over maxmemory (replicas' output buffers and the AOF buffer left out, as eviction
  /// leaves them out); 0 without maxmemory.
  float (*GetUsedMemoryRatio)();
  ServerInfoData* (*GetServerInfo)(Ctx*, const char* section);
  void (*FreeServerInfo)(Ctx*, ServerInfoData*);
  unsigned long long (*ServerInfoGetFieldUnsigned)(ServerInfoData*, const char* field, int* out_err);
};

/// The bound calls; valid once bind() has succeeded.
inline Api api{};

/// Looks every call up through the GetApi pointer in `ctx`'s first word; false when the server
/// lacks one (the name of the first missing call goes to `missing`).
bool bind(Ctx* ctx, const char** missing);

}  // namespace rm
