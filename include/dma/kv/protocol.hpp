/// @file
/// The side channel's protocol, once, for every server and client of it: the command table, the
/// parsing and validation of every argument, every error text, the reply shapes and the INFO
/// fields of `DMA.HELLO`, `DMA.SET`, `DMA.GET` and `DMA.INFO` (docs/side-channel.md). A server is
/// a thin host around it: it moves bytes, keeps values and answers with what this part says.
///
/// Every parse is pure: it reads the arguments of one command and says what they ask for, or the
/// error to answer. A command is refused for its form (arity, syntax, numbers, window, CRC, token,
/// size) before a server looks for its client (`-NOHELLO`) or its key.
#pragma once

#include <dma/endpoint.hpp>
#include <dma/export.hpp>
#include <dma/kv/resp.hpp>
#include <dma/metrics.hpp>
#include <dma/peer_address.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dma::kv {

// ---- Commands ------------------------------------------------------------------------------

/// What a server knows of one command of the protocol.
struct Command {
  std::string_view name;     ///< as clients send it (case-insensitive)
  std::size_t min_args;      ///< arguments, the name included, at least
  std::size_t max_args;      ///< and at most
  std::string_view flags;    ///< Redis command flags ("write deny-oom", "readonly", ...)
  int key_position;          ///< the one key's argument index, 0 without a key
  bool writes_key;           ///< the key is overwritten (DMA.SET) rather than read (DMA.GET)
  std::string_view summary;  ///< one line, for COMMAND DOCS
};

/// `DMA.HELLO <fabric-address-hex>`: binds the client's fabric address to this server.
inline constexpr Command hello_command{
    "DMA.HELLO", 2, 2, "readonly", 0, false, "Binds the client's fabric address to this server"};
/// `DMA.SET <key> <rkey> <remote-addr> <length> [<crc32c>] [CLIENT <token>]`.
inline constexpr Command set_command{
    "DMA.SET", 5, 8, "write deny-oom", 1, true, "Stores a value the server reads from the client's memory"};
/// `DMA.GET <key> <rkey> <remote-addr> <capacity> [<token>] [CLIENT <token>]`.
inline constexpr Command get_command{"DMA.GET", 5, 8, "readonly", 1, false, "Writes a value into the client's memory"};
/// `DMA.INFO`: the server's side-channel counters.
inline constexpr Command info_command{
    "DMA.INFO", 1, 1, "readonly fast", 0, false, "The side channel's state and counters"};
/// Every command of the protocol.
inline constexpr Command commands[] = {hello_command, set_command, get_command, info_command};

/// The command named `name` (any case), or null.
DMA_EXPORT const Command* find_command(std::string_view name) noexcept;

/// True when `arguments` (the name included) has an arity `command` takes.
inline bool arity_fits(const Command& command, std::size_t arguments) noexcept {
  return arguments >= command.min_args && arguments <= command.max_args;
}

// ---- Numbers -------------------------------------------------------------------------------

/// An unsigned decimal of the protocol: one or more ASCII digits, no sign, no space, at most
/// 2^64 - 1. Nullopt for anything else.
DMA_EXPORT std::optional<std::uint64_t> parse_number(std::string_view text) noexcept;

/// A client's argument as an error text shows it: its first 32 bytes, control bytes as `?`, and
/// `...` when it was longer.
DMA_EXPORT std::string quote(std::string_view argument);

// ---- DMA.GET confirmation ------------------------------------------------------------------

/// What tells a DMA.GET's client that the value has landed in its buffer, in the fourth element
/// of the DMA.HELLO reply.
enum class Confirmation {
  /// The DMA.GET reply comes once the bytes have landed (the provider confirms delivery: tcp, shm).
  reply,
  /// The reply comes once the server's write has completed, which does not say the bytes have
  /// landed (efa-direct): the client waits for its Target's notification carrying its token.
  notification,
};

/// A notification token travels as the write's immediate data; efa-direct carries 4 bytes of it.
inline constexpr std::uint64_t max_token = UINT32_MAX;

/// "reply" or "notification".
DMA_EXPORT std::string_view to_string(Confirmation confirmation) noexcept;
/// "reply" or "notification"; nullopt for anything else.
DMA_EXPORT std::optional<Confirmation> parse_confirmation(std::string_view text) noexcept;
/// A server's setting: "auto" (nullopt) or one of the two. False for anything else.
DMA_EXPORT bool parse_confirmation_setting(std::string_view text, std::optional<Confirmation>& setting) noexcept;
/// The setting applied to an open endpoint: auto means a notification exactly where a completed
/// write does not say the bytes have landed (EndpointInfo::delivery_confirmed).
DMA_EXPORT Confirmation resolve_confirmation(std::optional<Confirmation> setting, const EndpointInfo& info) noexcept;
/// Empty when the endpoint can carry a token as immediate data; otherwise why not.
DMA_EXPORT std::string check_token_room(const EndpointInfo& info);

// ---- Settings ----------------------------------------------------------------------------

/// The settings every server of the protocol takes, with their defaults: a module argument
/// `name value`, or `--name value` on dma-kv-server's command line.
struct ServerSettings {
  std::uint64_t max_value = std::uint64_t{16} << 20;  ///< `max-value`: bytes a DMA.SET may store
  bool allow_any_fabric_host = false;                 ///< `allow-any-fabric-host`: skip the same-host rule
  std::uint64_t transfer_deadline_ms = 0;             ///< `transfer-deadline-ms`; 0: the configuration's
  std::optional<Confirmation> confirm_gets;           ///< `confirm-gets`: none is auto, from the endpoint
  std::uint64_t max_hello_bindings = 65536;           ///< `max-hello-bindings`
  std::uint64_t hello_idle_seconds = 300;             ///< `hello-idle-seconds`
};

/// One setting of ServerSettings, for a server's help and its parser.
struct Setting {
  std::string_view name;      ///< as a module argument; `--name` on a command line
  bool flag;                  ///< yes/no (a command line's flag takes no value)
  std::string_view help;      ///< what it does, one line
  std::string_view fallback;  ///< its default, as text
};

/// Every setting of ServerSettings.
inline constexpr Setting settings[] = {
    {"max-value", false, "the largest value DMA.SET stores, bytes", "16777216"},
    {"allow-any-fabric-host", true,
     "accept a DMA.HELLO whose fabric address names another host than its connection (trusted networks only)", "no"},
    {"transfer-deadline-ms", false, "milliseconds a transfer may take before it fails (0: the configuration's, 30 s)",
     "0"},
    {"confirm-gets", false,
     "what tells a DMA.GET's client its bytes have landed: reply, notification (a write carrying the client's "
     "token), or auto (notification where a completed write does not say so)",
     "auto"},
    {"max-hello-bindings", false,
     "DMA.HELLO bindings at once; one beyond drops the least recently used one no connection holds", "65536"},
    {"hello-idle-seconds", false,
     "seconds a DMA.HELLO binding another connection named stays unused once the connection that sent it closed",
     "300"},
};

/// Sets `name` (one of `settings`) to `value`: "" when it took it, else what was wrong, naming the
/// setting and the value (`max-value takes a whole number of at least 1, not 'lots'`); nullopt
/// when `name` is no setting of the protocol. A flag takes `yes` or `no`.
DMA_EXPORT std::optional<std::string> apply_setting(ServerSettings& settings, std::string_view name,
                                                    std::string_view value);

// ---- DMA.HELLO -----------------------------------------------------------------------------

/// A DMA.HELLO's fabric address, decoded and checked against the server's endpoint format, or the
/// error to answer (`ERR invalid fabric address: ...`).
struct HelloRequest {
  std::vector<std::uint8_t> address;  ///< the client's raw fabric address
  std::string error;                  ///< empty when the address is usable
};

/// Parses `DMA.HELLO <hex>` (`arguments[0]` is the name). Checks arity, hex, the length against
/// the endpoint's `addr_format`, and the address's own form.
DMA_EXPORT HelloRequest parse_hello(std::span<const std::string_view> arguments, std::uint32_t addr_format);

/// Empty when `fabric_address` (raw bytes in the endpoint's `addr_format`) names the same host as
/// `peer_ip`, the RESP connection's remote address as text ("127.0.0.1", "::1"); otherwise why
/// not. IPv4-mapped IPv6 addresses compare as IPv4. Formats without an IP (FI_ADDR_EFA) cannot be
/// checked and pass. A client could otherwise make the server connect to, read from and write into
/// a third host: a tcp fabric address is a raw sockaddr the provider connects to on demand.
DMA_EXPORT std::string check_same_host(std::span<const std::uint8_t> fabric_address, std::uint32_t addr_format,
                                       std::string_view peer_ip);

/// The IP a sockaddr fabric address names, as text ("10.0.0.7"), or "" for other formats.
DMA_EXPORT std::string fabric_host(std::span<const std::uint8_t> fabric_address, std::uint32_t addr_format);

/// What a DMA.HELLO reply carries, in this order: the server's fabric address (bulk, hex), the
/// client's id (integer), the largest value (integer), the GET confirmation (bulk), the client's
/// token (bulk, 32 hex digits).
struct HelloReply {
  std::string server_address_hex;                   ///< the server's fabric address, hex
  std::uint64_t client_id = 0;                      ///< the server's id for this client
  std::uint64_t max_value = 0;                      ///< bytes a DMA.SET may store at most
  Confirmation confirmation = Confirmation::reply;  ///< what confirms a DMA.GET
  std::string token;                                ///< names the client: `CLIENT <token>`
};

/// Appends the DMA.HELLO reply in RESP.
DMA_EXPORT void append_hello_reply(std::string& out, const HelloReply& reply);

/// A DMA.HELLO reply as a client reads it: `error` is the server's error, or what is wrong with
/// the reply's shape, and empty when `reply` holds it. A reply of three elements (a server that
/// names no confirmation and no token) reads as `reply` confirmation and an empty token.
struct HelloReplyRead {
  HelloReply reply;   ///< what the server said
  std::string error;  ///< empty when the reply had the shape of a DMA.HELLO reply
};
/// Reads a DMA.HELLO reply.
DMA_EXPORT HelloReplyRead read_hello_reply(const resp::Reply& reply);

// ---- DMA.SET and DMA.GET -------------------------------------------------------------------

/// The client's buffer a transfer reads or writes: `<rkey> <remote-addr> <length>`.
struct Window {
  std::uint64_t rkey = 0;     ///< the registration's remote key
  std::uint64_t address = 0;  ///< the remote address (an offset on tcp)
  std::uint64_t length = 0;   ///< DMA.SET: the value's length; DMA.GET: the buffer's capacity
};

/// A parsed DMA.SET or DMA.GET; `error` is empty when it is well formed.
struct TransferRequest {
  std::string_view key;                    ///< the key (views the arguments)
  Window window;                           ///< the client's buffer
  std::optional<std::uint32_t> crc;        ///< DMA.SET: the CRC-32C the client computed
  std::optional<std::uint32_t> token;      ///< DMA.GET: the notification token
  std::optional<std::string_view> client;  ///< `CLIENT <token>`: the DMA.HELLO token it names
  std::string error;                       ///< the error to answer, or empty
};

/// Parses `DMA.SET <key> <rkey> <remote-addr> <length> [<crc32c>] [CLIENT <token>]`; a length
/// over `max_value` is refused, and an empty value with a CRC other than 0.
DMA_EXPORT TransferRequest parse_set(std::span<const std::string_view> arguments, std::uint64_t max_value);
/// Parses `DMA.GET <key> <rkey> <remote-addr> <capacity> [<token>] [CLIENT <token>]`.
DMA_EXPORT TransferRequest parse_get(std::span<const std::string_view> arguments);

/// A client's `DMA.HELLO <address-hex>`, for resp::encode_command.
DMA_EXPORT std::vector<std::string> hello_arguments(std::span<const std::uint8_t> address);
/// A client's `DMA.SET key rkey remote-addr length [crc32c] [CLIENT token]`; no CLIENT when
/// `client_token` is empty.
DMA_EXPORT std::vector<std::string> set_arguments(std::string_view key, const Window& window,
                                                  std::optional<std::uint32_t> crc, std::string_view client_token);
/// A client's `DMA.GET key rkey remote-addr capacity [token] [CLIENT token]`; no CLIENT when
/// `client_token` is empty.
DMA_EXPORT std::vector<std::string> get_arguments(std::string_view key, const Window& window,
                                                  std::optional<std::uint32_t> token, std::string_view client_token);

/// Appends the DMA.GET reply in RESP: the value's length and its CRC-32C.
DMA_EXPORT void append_get_reply(std::string& out, std::uint64_t length, std::uint32_t crc);

/// A DMA.GET reply as a client reads it.
struct GetReplyRead {
  std::uint64_t length = 0;  ///< the value's length
  std::uint32_t crc = 0;     ///< its CRC-32C, taken when it arrived at the server
  std::string error;         ///< the server's error, or what is wrong with the reply; empty when read
};
/// Reads a DMA.GET reply.
DMA_EXPORT GetReplyRead read_get_reply(const resp::Reply& reply);

// ---- Error texts ---------------------------------------------------------------------------

/// Every error the protocol answers, as the text after RESP's `-` (its first word is the error
/// code a client acts on: ERR, NOHELLO, TRYAGAIN, CLUSTERDOWN, OOM, WRONGTYPE).
namespace errors {
/// The Redis text for a wrong number of arguments, the name in lower case.
DMA_EXPORT std::string wrong_arity(std::string_view command);
/// A command the server does not know.
DMA_EXPORT std::string unknown_command(std::string_view name);
/// A RESP framing error (closes the connection).
DMA_EXPORT std::string protocol(std::string_view what);
/// A request over the server's input limit (closes the connection).
DMA_EXPORT std::string request_too_large();
/// The server's input buffers are all taken (closes the connection); `option` names the setting.
DMA_EXPORT std::string client_buffers_full(std::uint64_t limit, std::string_view option);
/// A connection over the server's client limit.
DMA_EXPORT std::string max_clients();
/// `SET` with options a server does not take.
DMA_EXPORT std::string set_options();
/// A second DMA.HELLO on one connection.
DMA_EXPORT std::string hello_repeated();
/// A DMA.HELLO whose address the server refuses, and why.
DMA_EXPORT std::string invalid_fabric_address(std::string_view why);
/// Every DMA.HELLO binding is held; `option` names the setting, `limit` its value.
DMA_EXPORT std::string too_many_bindings(std::string_view option, std::uint64_t limit);
/// A HELLO token could not be drawn.
DMA_EXPORT std::string no_random(std::string_view what);
/// A data command whose client the server cannot place; `client` is the token it named.
DMA_EXPORT std::string no_hello(std::optional<std::string_view> client);
/// A value over the server's size limit.
DMA_EXPORT std::string value_too_large(std::uint64_t length, std::uint64_t limit);
/// DMA.GET of a key that holds no value.
DMA_EXPORT std::string no_such_key();
/// DMA.GET of a key that holds something else than a string.
DMA_EXPORT std::string wrong_type();
/// DMA.GET into a buffer smaller than the value.
DMA_EXPORT std::string buffer_too_small(std::uint64_t length, std::uint64_t capacity);
/// The transfer failed; `why` is the library's message.
DMA_EXPORT std::string transfer_failed(std::string_view why);
/// The bytes read do not have the CRC the client sent. Names only what the client sent: a digest
/// of what arrived says nothing the client needs and would reveal something of server memory.
DMA_EXPORT std::string crc_mismatch(std::uint32_t expected);
/// Registering a value's storage failed.
DMA_EXPORT std::string registration_failed(std::uint64_t length, std::string_view why);
/// The server's value memory is full; `option` names the setting.
DMA_EXPORT std::string value_memory_full(std::uint64_t limit, std::string_view option);
/// The server is over its maxmemory (Redis's own text).
DMA_EXPORT std::string over_maxmemory();
/// Memory for a DMA.GET's copy of a value could not be had.
DMA_EXPORT std::string copy_out_of_memory(std::uint64_t length);
/// DMA.GET copies would pass the server's total copy limit.
DMA_EXPORT std::string copy_limit(std::uint64_t held, std::uint64_t length, std::uint64_t limit);
/// DMA.GET copies of one client would pass its limit.
DMA_EXPORT std::string client_copy_limit(std::uint64_t held, std::uint64_t length, std::uint64_t limit);
/// A DMA.SET completed while writes were paused: nothing was stored.
DMA_EXPORT std::string writes_paused();
/// A DMA.SET completed after its key's slot left this node: nothing was stored.
DMA_EXPORT std::string slot_moved();
/// A DMA.SET completed after the cluster went down: nothing was stored.
DMA_EXPORT std::string cluster_down();
/// A blocking command inside MULTI or a script.
DMA_EXPORT std::string cannot_block(std::string_view command);
/// The server is stopping its fabric service.
DMA_EXPORT std::string shutting_down();
}  // namespace errors

/// What an error reply says, for a client to act on: its code (the first word), and for `ERR`
/// the protocol's texts a client tells apart.
enum class ErrorReply {
  no_hello,          ///< `NOHELLO`: send DMA.HELLO (errors::no_hello)
  try_again,         ///< `TRYAGAIN`: nothing was stored; send the command again
  cluster_down,      ///< `CLUSTERDOWN`
  out_of_memory,     ///< `OOM`
  wrong_type,        ///< `WRONGTYPE`
  moved,             ///< `MOVED <slot> <host:port>`: the slot lives on another node
  ask,               ///< `ASK <slot> <host:port>`: ask the other node, this once
  no_such_key,       ///< errors::no_such_key
  transfer_failed,   ///< errors::transfer_failed
  crc_mismatch,      ///< errors::crc_mismatch
  value_too_large,   ///< errors::value_too_large
  buffer_too_small,  ///< errors::buffer_too_small
  other,             ///< any other error
};
/// Which of ErrorReply an error reply's text (without RESP's `-`) is.
DMA_EXPORT ErrorReply classify_error(std::string_view text) noexcept;

// ---- Cluster ----------------------------------------------------------------------------

/// Slots of a Redis/Valkey cluster.
inline constexpr int cluster_slots = 16384;

/// The cluster slot of `key`: CRC-16/XMODEM of the key, or of its hash tag (the bytes between the
/// first `{` and the next `}`, when there are any), modulo 16384, as the cluster computes it.
DMA_EXPORT int key_slot(std::string_view key) noexcept;

/// A `-MOVED` or `-ASK` error reply, read.
struct Redirect {
  bool ask = false;  ///< `ASK`: this command only, after `ASKING`; `MOVED`: the slot's new owner
  int slot = 0;      ///< the slot
  std::string host;  ///< the node's address (empty in the reply: the node that answered)
  std::uint16_t port = 0;
};
/// The redirect an error text holds (`MOVED <slot> <host>:<port>` or `ASK …`, possibly after a
/// `COMMAND: ` prefix, as a Client's result detail has it); nothing when it holds none.
DMA_EXPORT std::optional<Redirect> parse_redirect(std::string_view text);

// ---- DMA.INFO ------------------------------------------------------------------------------

/// The sections of DMA.INFO, in their order.
enum class InfoSection { server, clients, keyspace, memory, commands, transfers, service };

/// What every server reports in DMA.INFO, whatever hosts it.
struct InfoFields {
  std::string_view server;                          ///< the server's name: "dma-kv-server", "dma-module"
  std::string_view provider;                        ///< the fabric provider
  std::string_view fabric_address;                  ///< the server's fabric address, hex
  bool any_fabric_host = false;                     ///< DMA.HELLO may name another host than its connection
  std::uint64_t max_value = 0;                      ///< bytes a DMA.SET may store at most
  Confirmation confirmation = Confirmation::reply;  ///< what confirms a DMA.GET
  std::uint64_t dma_clients = 0;                    ///< connections past DMA.HELLO now
  std::uint64_t hellos = 0;                         ///< DMA.HELLOs accepted
  std::uint64_t hellos_rejected = 0;                ///< DMA.HELLOs refused
  std::uint64_t hello_bindings = 0;                 ///< bindings now
  std::uint64_t hello_bindings_dropped = 0;         ///< bindings dropped idle or for room
  std::uint64_t no_hello = 0;                       ///< data commands answered -NOHELLO
  std::uint64_t outstanding = 0;                    ///< transfers the service holds
  std::uint64_t sets_in_flight = 0;                 ///< DMA.SET transfers submitted and not completed
  std::uint64_t gets_in_flight = 0;                 ///< DMA.GET transfers submitted and not completed
  std::uint64_t transfers_ok = 0;                   ///< transfers that completed
  std::uint64_t transfers_failed = 0;               ///< transfers that failed
  std::uint64_t transfers_timed_out = 0;            ///< of those, by the transfer deadline
  std::uint64_t crc_mismatches = 0;                 ///< DMA.SETs refused for their CRC
  std::uint64_t bytes_read = 0;                     ///< pulled out of clients by DMA.SET
  std::uint64_t bytes_written = 0;                  ///< pushed into clients by DMA.GET
  std::uint64_t gets_notified = 0;                  ///< DMA.GET writes that carried the client's token
  std::optional<Metrics> service;                   ///< the fabric service's, while it runs
};

/// Builds an INFO text: `# Section` headers and `field:value` lines, CRLF-terminated.
class DMA_EXPORT InfoText {
 public:
  /// Starts a section.
  void section(std::string_view name);
  /// One `field:value` line.
  void field(std::string_view name, std::string_view value);
  /// One `field:value` line of a number.
  void field(std::string_view name, std::uint64_t value);
  /// One `field:yes|no` line.
  void flag(std::string_view name, bool value);
  /// The text so far.
  const std::string& text() const noexcept { return text_; }

 private:
  std::string text_;
};

/// A server's own fields: called at the end of each section, and for the keyspace, memory and
/// commands sections, which only some servers have (a section with no field is left out).
using InfoExtra = void (*)(InfoSection section, InfoText& text, const void* context);

/// DMA.INFO's text: the protocol's fields in their sections, each server's own after them.
DMA_EXPORT std::string info_text(const InfoFields& fields, InfoExtra extra = nullptr, const void* context = nullptr);

/// Template form of info_text() for a callable `extra(InfoSection, InfoText&)`.
template <class Extra>
std::string info_text(const InfoFields& fields, const Extra& extra) {
  return info_text(
      fields,
      [](InfoSection section, InfoText& text, const void* context) {
        (*static_cast<const Extra*>(context))(section, text);
      },
      &extra);
}

}  // namespace dma::kv
