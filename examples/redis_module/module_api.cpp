#include "module_api.hpp"

#include <cstring>
#include <string>

namespace rm {

namespace {

// One entry per call: its documented name and where its pointer goes.
struct Slot {
  const char* name;
  void* target;
};

template <typename F>
Slot slot(const char* name, F& pointer) {
  return Slot{name, static_cast<void*>(&pointer)};
}

}  // namespace

bool describe_single_key_command(Ctx* ctx, const char* name, const char* summary, int arity, std::uint64_t key_flags) {
  Command* command = api.GetCommand(ctx, name);
  if (command == nullptr) return false;
  CommandKeySpec specs[2]{};  // the second, all zero, ends the list
  specs[0].flags = key_flags;
  specs[0].begin_search_type = begin_search_index;
  specs[0].bs.index.pos = 1;
  specs[0].find_keys_type = find_keys_range;
  specs[0].fk.range = {0, 1, 0};  // one key: the last is the first
  CommandInfo info;
  info.summary = summary;
  info.arity = arity;
  info.key_specs = specs;
  return api.SetCommandInfo(command, &info) == ok;
}

bool bind(Ctx* ctx, const char** missing) {
  // The context's first word is the server's lookup function (the documented RedisModule_Init).
  void* lookup = nullptr;
  std::memcpy(&lookup, static_cast<void*>(ctx), sizeof lookup);
  api.GetApi = reinterpret_cast<int (*)(const char*, void*)>(reinterpret_cast<std::uintptr_t>(lookup));
  const Slot slots[] = {
      slot("IsModuleNameBusy", api.IsModuleNameBusy),
      slot("SetModuleAttribs", api.SetModuleAttribs),
      slot("CreateCommand", api.CreateCommand),
      slot("SubscribeToServerEvent", api.SubscribeToServerEvent),
      slot("SubscribeToKeyspaceEvents", api.SubscribeToKeyspaceEvents),
      slot("Log", api.Log),
      slot("WrongArity", api.WrongArity),
      slot("ReplyWithError", api.ReplyWithError),
      slot("ReplyWithSimpleString", api.ReplyWithSimpleString),
      slot("ReplyWithLongLong", api.ReplyWithLongLong),
      slot("ReplyWithArray", api.ReplyWithArray),
      slot("ReplyWithStringBuffer", api.ReplyWithStringBuffer),
      slot("GetContextFlags", api.GetContextFlags),
      slot("GetSelectedDb", api.GetSelectedDb),
      slot("CreateString", api.CreateString),
      slot("FreeString", api.FreeString),
      slot("RetainString", api.RetainString),
      slot("StringPtrLen", api.StringPtrLen),
      slot("OpenKey", api.OpenKey),
      slot("CloseKey", api.CloseKey),
      slot("KeyType", api.KeyType),
      slot("StringSet", api.StringSet),
      slot("StringDMA", api.StringDMA),
      slot("NotifyKeyspaceEvent", api.NotifyKeyspaceEvent),
      slot("Replicate", api.Replicate),
      slot("BlockClient", api.BlockClient),
      slot("UnblockClient", api.UnblockClient),
      slot("GetBlockedClientPrivateData", api.GetBlockedClientPrivateData),
      slot("SetDisconnectCallback", api.SetDisconnectCallback),
      slot("GetClientId", api.GetClientId),
      slot("GetClientInfoById", api.GetClientInfoById),
      slot("Alloc", api.Alloc),
      slot("Free", api.Free),
      slot("GetUsedMemoryRatio", api.GetUsedMemoryRatio),
      slot("GetServerInfo", api.GetServerInfo),
      slot("FreeServerInfo", api.FreeServerInfo),
      slot("ServerInfoGetFieldUnsigned", api.ServerInfoGetFieldUnsigned),
      slot("Call", api.Call),
      slot("FreeCallReply", api.FreeCallReply),
      slot("AvoidReplicaTraffic", api.AvoidReplicaTraffic),
      slot("GetCommand", api.GetCommand),
      slot("SetCommandInfo", api.SetCommandInfo),
  };
  for (const Slot& s : slots) {
    const std::string name = std::string("RedisModule_") + s.name;
    if (api.GetApi(name.c_str(), s.target) != ok) {
      *missing = s.name;
      return false;
    }
  }
  return true;
}

}  // namespace rm
