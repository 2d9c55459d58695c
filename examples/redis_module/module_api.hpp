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
struct Command;
struct CallReply;

inline constexpr int ok = 0;
inline constexpr int err = 1;
inline constexpr int api_version_1 = 1;

/// OpenKey modes.
inline constexpr int read = 1 << 0;
inline constexpr int write = 1 << 1;
inline constexpr int open_key_notouch = 1 << 16;  ///< OpenKey leaves the key's LRU/LFU as it is

/// KeyType results.
inline constexpr int keytype_empty = 0;
inline constexpr int keytype_string = 1;

/// GetContextFlags bits.
inline constexpr int ctx_flags_lua = 1 << 0;
inline constexpr int ctx_flags_multi = 1 << 1;
inline constexpr int ctx_flags_cluster = 1 << 5;  ///< the server runs with cluster-enabled yes
inline constexpr int ctx_flags_evict = 1 << 9;    ///< maxmemory with a policy that may delete keys
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
inline constexpr Event event_cron_loop{8, 1};  ///< every server cron tick (hz times a second)
inline constexpr Event event_loop{15, 1};      ///< every event-loop iteration, before and after sleeping
inline constexpr std::uint64_t subevent_before_sleep = 0;
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

/// SetCommandInfo's key-spec flags (REDISMODULE_CMD_KEY_*).
inline constexpr std::uint64_t key_ro = 1 << 0;      ///< reads the key's value
inline constexpr std::uint64_t key_ow = 1 << 2;      ///< overwrites the key's value
inline constexpr std::uint64_t key_access = 1 << 4;  ///< returns (part of) the value to the client
inline constexpr std::uint64_t key_update = 1 << 5;  ///< writes the value
/// Key-spec search types.
inline constexpr int begin_search_index = 2;
inline constexpr int find_keys_range = 2;

/// One key spec of a command (RedisModuleCommandKeySpec); an all-zero one ends a list.
struct CommandKeySpec {
  const char* notes = nullptr;
  std::uint64_t flags = 0;
  int begin_search_type = 0;
  union {
    struct {
      int pos;
    } index;
    struct {
      const char* keyword;
      int startfrom;
    } keyword;
  } bs{};
  int find_keys_type = 0;
  union {
    struct {
      int lastkey;
      int keystep;
      int limit;
    } range;
    struct {
      int keynumidx;
      int firstkey;
      int keystep;
    } keynum;
  } fk{};
};

struct CommandHistoryEntry {
  const char* since;
  const char* changes;
};

/// RedisModuleCommandArg, as far as the server reads it (this module passes none).
struct CommandArg {
  const char* name;
  int type;
  int key_spec_index;
  const char* token;
  const char* summary;
  const char* since;
  int flags;
  const char* deprecated_since;
  CommandArg* subargs;
  const char* display_text;
};

/// Tells the server the sizes of the structures below, which it reads with these strides.
struct CommandInfoVersion {
  int version;
  std::size_t sizeof_historyentry;
  std::size_t sizeof_keyspec;
  std::size_t sizeof_arg;
};
inline constexpr CommandInfoVersion command_info_version{1, sizeof(CommandHistoryEntry), sizeof(CommandKeySpec),
                                                         sizeof(CommandArg)};

/// RedisModuleCommandInfo.
struct CommandInfo {
  const CommandInfoVersion* version = &command_info_version;
  const char* summary = nullptr;
  const char* complexity = nullptr;
  const char* since = nullptr;
  CommandHistoryEntry* history = nullptr;
  const char* tips = nullptr;
  int arity = 0;  ///< the command's name counted; -N: at least N
  CommandKeySpec* key_specs = nullptr;
  CommandArg* args = nullptr;
};

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

  /// Runs a command as a client of the module would; null with errno set when it cannot run (in a
  /// cluster: EPERM for a key this node does not serve, ENETDOWN/EROFS while the cluster is down).
  CallReply* (*Call)(Ctx*, const char* command, const char* format, ...);
  void (*FreeCallReply)(CallReply*);
  /// Non-zero while writes are paused (CLIENT PAUSE WRITE, a manual failover, the shutdown wait):
  /// nothing may be replicated then.
  int (*AvoidReplicaTraffic)();

  Command* (*GetCommand)(Ctx*, const char* name);
  int (*SetCommandInfo)(Command*, const CommandInfo*);
};

/// The bound calls; valid once bind() has succeeded.
inline Api api{};

/// Describes the command `name` (created in this OnLoad) to the server: its summary and arity, and
/// one key at argv[1] with `key_flags`, so that COMMAND INFO, COMMAND GETKEYS, ACL key patterns
/// (%R~, %W~) and cluster routing treat it as the built-in command with those flags.
bool describe_single_key_command(Ctx* ctx, const char* name, const char* summary, int arity, std::uint64_t key_flags);

/// Looks every call up through the GetApi pointer in `ctx`'s first word; false when the server
/// lacks one (the name of the first missing call goes to `missing`).
bool bind(Ctx* ctx, const char** missing);

}  // namespace rm
