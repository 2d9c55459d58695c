#include <dma/advertisement.hpp>
#include <dma/kv/protocol.hpp>
#include <dma/kv/resp.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>

#include <algorithm>
#include <cstring>

namespace dma::kv {
namespace {

// The optional arguments after a DMA.SET's or DMA.GET's window: at most one positional value
// (DMA.SET's crc32c, DMA.GET's notification token), then `CLIENT <token>`. Empty when they parse.
std::string parse_tail(std::span<const std::string_view> rest, std::optional<std::string_view>& positional,
                       std::optional<std::string_view>& client) {
  std::size_t i = 0;
  if (i < rest.size() && !resp::iequals(rest[i], "CLIENT")) positional = rest[i++];
  if (i < rest.size()) {
    if (!resp::iequals(rest[i], "CLIENT")) return "ERR syntax error: expected CLIENT <token>";
    if (i + 1 >= rest.size()) return "ERR syntax error: CLIENT needs the token DMA.HELLO returned";
    client = rest[i + 1];
    i += 2;
  }
  if (i != rest.size()) return "ERR syntax error: nothing may follow CLIENT <token>";
  return {};
}

// The key, the window and the tail of a data command whose arity `command` takes.
TransferRequest parse_transfer(const Command& command, std::span<const std::string_view> arguments,
                               const char* length_name, std::optional<std::string_view>& positional) {
  TransferRequest request;
  if (!arity_fits(command, arguments.size())) {
    request.error = errors::wrong_arity(command.name);
    return request;
  }
  request.key = arguments[1];
  const auto rkey = parse_number(arguments[2]);
  const auto address = parse_number(arguments[3]);
  const auto length = parse_number(arguments[4]);
  if (!rkey) {
    request.error = "ERR invalid rkey " + quote(arguments[2]);
  } else if (!address) {
    request.error = "ERR invalid remote address " + quote(arguments[3]);
  } else if (!length) {
    request.error = "ERR invalid " + std::string(length_name) + " " + quote(arguments[4]);
  } else if (*length > UINT64_MAX - *address) {
    request.error = "ERR the remote range overflows";
  } else {
    request.window = Window{*rkey, *address, *length};
    request.error = parse_tail(arguments.subspan(5), positional, request.client);
  }
  return request;
}

std::optional<std::string> ip_of(std::span<const std::uint8_t> bytes, std::uint32_t addr_format) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr_format == FI_SOCKADDR_IN && bytes.size() == sizeof(sockaddr_in)) {
    sockaddr_in in{};
    std::memcpy(&in, bytes.data(), sizeof in);
    if (in.sin_family != AF_INET || inet_ntop(AF_INET, &in.sin_addr, text, sizeof text) == nullptr) return {};
    return std::string(text);
  }
  if (addr_format == FI_SOCKADDR_IN6 && bytes.size() == sizeof(sockaddr_in6)) {
    sockaddr_in6 in6{};
    std::memcpy(&in6, bytes.data(), sizeof in6);
    if (in6.sin6_family != AF_INET6) return {};
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      in_addr v4{};
      std::memcpy(&v4, in6.sin6_addr.s6_addr + 12, sizeof v4);
      if (inet_ntop(AF_INET, &v4, text, sizeof text) == nullptr) return {};
    } else if (inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text) == nullptr) {
      return {};
    }
    return std::string(text);
  }
  return {};
}

// An IP address's text in one form: IPv4-mapped IPv6 as IPv4, IPv6 as inet_ntop writes it.
// Nullopt when it is no IP.
std::optional<std::string> normalise_ip(std::string_view text) {
  const std::string s(text);
  char out[INET6_ADDRSTRLEN] = {};
  in_addr v4{};
  if (inet_pton(AF_INET, s.c_str(), &v4) == 1) {
    inet_ntop(AF_INET, &v4, out, sizeof out);
    return std::string(out);
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, s.c_str(), &v6) != 1) return std::nullopt;
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    std::memcpy(&v4, v6.s6_addr + 12, sizeof v4);
    inet_ntop(AF_INET, &v4, out, sizeof out);
  } else {
    inet_ntop(AF_INET6, &v6, out, sizeof out);
  }
  return std::string(out);
}

}  // namespace

const Command* find_command(std::string_view name) noexcept {
  for (const auto& command : commands) {
    if (resp::iequals(command.name, name)) return &command;
  }
  return nullptr;
}

std::optional<std::uint64_t> parse_number(std::string_view text) noexcept {
  if (text.empty() || text.size() > 20) return std::nullopt;
  std::uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

std::string quote(std::string_view argument) {
  constexpr std::size_t shown = 32;
  std::string text = "'";
  for (const char c : argument.substr(0, shown)) {
    const auto u = static_cast<unsigned char>(c);
    text += u < 0x20 || u == 0x7f ? '?' : c;
  }
  if (argument.size() > shown) text += "...";
  text += '\'';
  return text;
}

std::string_view to_string(Confirmation confirmation) noexcept {
  return confirmation == Confirmation::reply ? "reply" : "notification";
}

std::optional<Confirmation> parse_confirmation(std::string_view text) noexcept {
  if (text == "reply") return Confirmation::reply;
  if (text == "notification") return Confirmation::notification;
  return std::nullopt;
}

bool parse_confirmation_setting(std::string_view text, std::optional<Confirmation>& setting) noexcept {
  if (text == "auto") {
    setting.reset();
    return true;
  }
  const auto parsed = parse_confirmation(text);
  if (parsed) setting = parsed;
  return parsed.has_value();
}

Confirmation resolve_confirmation(std::optional<Confirmation> setting, const EndpointInfo& info) noexcept {
  return setting.value_or(info.delivery_confirmed ? Confirmation::reply : Confirmation::notification);
}

std::string check_token_room(const EndpointInfo& info) {
  if (info.cq_data_size >= 4) return {};
  return "the provider " + info.provider + " carries " + std::to_string(info.cq_data_size) +
         " bytes of immediate data; a DMA.GET notification token needs 4";
}

std::optional<std::string> apply_setting(ServerSettings& settings, std::string_view name, std::string_view value) {
  const auto number = [&](std::uint64_t low, std::uint64_t& field) -> std::string {
    const auto parsed = parse_number(value);
    if (!parsed || *parsed < low) {
      return std::string(name) + " takes a whole number of at least " + std::to_string(low) + ", not " + quote(value);
    }
    field = *parsed;
    return {};
  };
  if (name == "max-value") return number(1, settings.max_value);
  if (name == "transfer-deadline-ms") return number(0, settings.transfer_deadline_ms);
  if (name == "max-hello-bindings") return number(1, settings.max_hello_bindings);
  if (name == "hello-idle-seconds") return number(1, settings.hello_idle_seconds);
  if (name == "allow-any-fabric-host") {
    if (value != "yes" && value != "no") return std::string(name) + " takes yes or no, not " + quote(value);
    settings.allow_any_fabric_host = value == "yes";
    return std::string();
  }
  if (name == "confirm-gets") {
    if (!parse_confirmation_setting(value, settings.confirm_gets)) {
      return std::string(name) + " takes auto, reply or notification, not " + quote(value);
    }
    return std::string();
  }
  return std::nullopt;
}

HelloRequest parse_hello(std::span<const std::string_view> arguments, std::uint32_t addr_format) {
  HelloRequest request;
  if (!arity_fits(hello_command, arguments.size())) {
    request.error = errors::wrong_arity(hello_command.name);
    return request;
  }
  const std::string_view hex = arguments[1];
  if (hex.size() > 2 * PeerAddress::capacity) {
    request.error = errors::invalid_fabric_address("longer than any supported format");
    return request;
  }
  std::error_code ec;
  const auto address = decode_hex(hex, ec);
  if (ec) {
    request.error = errors::invalid_fabric_address("not hex");
  } else if (ec = validate_address(address, addr_format); ec) {
    request.error = errors::invalid_fabric_address(ec.message());
  } else {
    request.address = address;
  }
  return request;
}

std::string check_same_host(std::span<const std::uint8_t> fabric_address, std::uint32_t addr_format,
                            std::string_view peer_ip) {
  if (addr_format != FI_SOCKADDR_IN && addr_format != FI_SOCKADDR_IN6) return {};
  const auto ip = ip_of(fabric_address, addr_format);
  if (!ip) return "the fabric address is not a socket address of the server's format";
  const auto peer = normalise_ip(peer_ip);
  if (!peer) return "the connection's address " + quote(peer_ip) + " is not an IP";
  if (*ip != *peer) return "the fabric address names host " + *ip + ", but the connection comes from " + *peer;
  return {};
}

std::string fabric_host(std::span<const std::uint8_t> fabric_address, std::uint32_t addr_format) {
  return ip_of(fabric_address, addr_format).value_or(std::string());
}

void append_hello_reply(std::string& out, const HelloReply& reply) {
  resp::append_array_header(out, 5);
  resp::append_bulk(out, reply.server_address_hex);
  resp::append_integer(out, static_cast<std::int64_t>(reply.client_id));
  resp::append_integer(out, static_cast<std::int64_t>(reply.max_value));
  resp::append_bulk(out, to_string(reply.confirmation));
  resp::append_bulk(out, reply.token);
}

HelloReplyRead read_hello_reply(const resp::Reply& reply) {
  using Type = resp::Reply::Type;
  HelloReplyRead read;
  if (reply.is_error()) {
    read.error = std::string(reply.text);
    return read;
  }
  const auto& e = reply.elements;
  if (reply.type != Type::array || e.size() < 3 || e.size() > 5 || e[0].type != Type::bulk ||
      e[1].type != Type::integer || e[2].type != Type::integer || e[1].integer < 0 || e[2].integer < 0 ||
      (e.size() >= 4 && e[3].type != Type::bulk) || (e.size() == 5 && e[4].type != Type::bulk)) {
    read.error =
        "not a DMA.HELLO reply (an array of the server's address, the client's id, the value limit, "
        "the confirmation and the token)";
    return read;
  }
  read.reply.server_address_hex = std::string(e[0].text);
  read.reply.client_id = static_cast<std::uint64_t>(e[1].integer);
  read.reply.max_value = static_cast<std::uint64_t>(e[2].integer);
  if (e.size() >= 4) {
    const auto confirmation = parse_confirmation(e[3].text);
    if (!confirmation) {
      read.error = "DMA.HELLO names an unknown confirmation " + quote(e[3].text);
      return read;
    }
    read.reply.confirmation = *confirmation;
  }
  if (e.size() == 5) read.reply.token = std::string(e[4].text);
  return read;
}

GetReplyRead read_get_reply(const resp::Reply& reply) {
  using Type = resp::Reply::Type;
  GetReplyRead read;
  if (reply.is_error()) {
    read.error = std::string(reply.text);
  } else if (reply.type != Type::array || reply.elements.size() != 2 || reply.elements[0].type != Type::integer ||
             reply.elements[1].type != Type::integer || reply.elements[0].integer < 0 ||
             reply.elements[1].integer < 0 || reply.elements[1].integer > std::int64_t{UINT32_MAX}) {
    read.error = "not a DMA.GET reply (an array of the value's length and its crc32c)";
  } else {
    read.length = static_cast<std::uint64_t>(reply.elements[0].integer);
    read.crc = static_cast<std::uint32_t>(reply.elements[1].integer);
  }
  return read;
}

TransferRequest parse_set(std::span<const std::string_view> arguments, std::uint64_t max_value) {
  std::optional<std::string_view> crc_text;
  auto request = parse_transfer(set_command, arguments, "length", crc_text);
  if (!request.error.empty()) return request;
  if (crc_text) {
    const auto crc = parse_number(*crc_text);
    if (!crc || *crc > UINT32_MAX) {
      request.error = "ERR invalid crc32c " + quote(*crc_text);
      return request;
    }
    request.crc = static_cast<std::uint32_t>(*crc);
  }
  if (request.window.length > max_value) {
    request.error = errors::value_too_large(request.window.length, max_value);
  } else if (request.window.length == 0 && request.crc.value_or(0) != 0) {
    request.error = "ERR CRC mismatch: an empty value has crc32c 0";
  }
  return request;
}

TransferRequest parse_get(std::span<const std::string_view> arguments) {
  std::optional<std::string_view> token_text;
  auto request = parse_transfer(get_command, arguments, "capacity", token_text);
  if (!request.error.empty() || !token_text) return request;
  const auto token = parse_number(*token_text);
  if (!token || *token > max_token) {
    request.error = "ERR invalid token " + quote(*token_text) + ": a notification token is a number below 2^32";
  } else {
    request.token = static_cast<std::uint32_t>(*token);
  }
  return request;
}

std::vector<std::string> hello_arguments(std::span<const std::uint8_t> address) {
  return {std::string(hello_command.name), encode_hex(address)};
}

namespace {

std::vector<std::string> transfer_arguments(const Command& command, std::string_view key, const Window& window,
                                            std::optional<std::uint32_t> positional, std::string_view client_token) {
  std::vector<std::string> arguments{std::string(command.name), std::string(key), std::to_string(window.rkey),
                                     std::to_string(window.address), std::to_string(window.length)};
  if (positional) arguments.push_back(std::to_string(*positional));
  if (!client_token.empty()) {
    arguments.emplace_back("CLIENT");
    arguments.emplace_back(client_token);
  }
  return arguments;
}

}  // namespace

std::vector<std::string> set_arguments(std::string_view key, const Window& window, std::optional<std::uint32_t> crc,
                                       std::string_view client_token) {
  return transfer_arguments(set_command, key, window, crc, client_token);
}

std::vector<std::string> get_arguments(std::string_view key, const Window& window, std::optional<std::uint32_t> token,
                                       std::string_view client_token) {
  return transfer_arguments(get_command, key, window, token, client_token);
}

void append_get_reply(std::string& out, std::uint64_t length, std::uint32_t crc) {
  resp::append_array_header(out, 2);
  resp::append_integer(out, static_cast<std::int64_t>(length));
  resp::append_integer(out, crc);
}

namespace {
// The texts a client tells apart (classify_error), shared with the builders below.
constexpr std::string_view value_prefix = "ERR value of ";
constexpr std::string_view value_too_large_middle = " bytes exceeds the limit of ";
constexpr std::string_view no_such_key_text = "ERR no such key";
constexpr std::string_view buffer_too_small_prefix = "ERR the value is ";
constexpr std::string_view buffer_too_small_middle = " bytes, the client's buffer holds ";
constexpr std::string_view transfer_failed_prefix = "ERR transfer failed: ";
constexpr std::string_view crc_mismatch_prefix = "ERR CRC mismatch: ";
}  // namespace

namespace errors {

std::string wrong_arity(std::string_view command) {
  std::string name(command);
  for (auto& c : name)
    c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return "ERR wrong number of arguments for '" + name + "' command";
}
std::string unknown_command(std::string_view name) { return "ERR unknown command " + quote(name); }
std::string protocol(std::string_view what) { return "ERR " + std::string(what); }
std::string request_too_large() { return "ERR Protocol error: request too large"; }
std::string client_buffers_full(std::uint64_t limit, std::string_view option) {
  return "ERR Protocol error: the server's client buffers are full (" + std::to_string(limit) + " bytes, " +
         std::string(option) + ")";
}
std::string max_clients() { return "ERR max number of clients reached"; }
std::string set_options() { return "ERR syntax error (SET takes no options here)"; }
std::string hello_repeated() { return "ERR DMA.HELLO was already sent on this connection"; }
std::string invalid_fabric_address(std::string_view why) { return "ERR invalid fabric address: " + std::string(why); }
std::string too_many_bindings(std::string_view option, std::uint64_t limit) {
  return "ERR too many DMA.HELLO bindings (" + std::string(option) + " " + std::to_string(limit) +
         "), each held by an open connection";
}
std::string no_random(std::string_view what) { return "ERR " + std::string(what); }
std::string no_hello(std::optional<std::string_view> client) {
  if (client) {
    return "NOHELLO this server has no DMA.HELLO for that client (it went, or was sent to another node): send "
           "DMA.HELLO here, then retry with its token";
  }
  return "NOHELLO send DMA.HELLO first, on this connection, or name the client: CLIENT <token>";
}
std::string value_too_large(std::uint64_t length, std::uint64_t limit) {
  return std::string(value_prefix) + std::to_string(length) + std::string(value_too_large_middle) +
         std::to_string(limit);
}
std::string no_such_key() { return std::string(no_such_key_text); }
std::string wrong_type() { return "WRONGTYPE Operation against a key holding the wrong kind of value"; }
std::string buffer_too_small(std::uint64_t length, std::uint64_t capacity) {
  return std::string(buffer_too_small_prefix) + std::to_string(length) + std::string(buffer_too_small_middle) +
         std::to_string(capacity);
}
std::string transfer_failed(std::string_view why) { return std::string(transfer_failed_prefix) + std::string(why); }
std::string crc_mismatch(std::uint32_t expected) {
  return std::string(crc_mismatch_prefix) + "the bytes read do not have the client's crc32c " +
         std::to_string(expected) + "; the store is unchanged";
}
std::string registration_failed(std::uint64_t length, std::string_view why) {
  return "ERR registering " + std::to_string(length) + " bytes: " + std::string(why);
}
std::string value_memory_full(std::uint64_t limit, std::string_view option) {
  return "OOM the server's value memory limit (" + std::to_string(limit) + " bytes, " + std::string(option) +
         ") is reached";
}
std::string over_maxmemory() { return "OOM command not allowed when used memory > 'maxmemory'."; }
std::string copy_out_of_memory(std::uint64_t length) {
  return "ERR out of memory for a DMA.GET copy of " + std::to_string(length) + " bytes";
}
std::string copy_limit(std::uint64_t held, std::uint64_t length, std::uint64_t limit) {
  return "ERR DMA.GET copies hold " + std::to_string(held) + " bytes and this value's " + std::to_string(length) +
         " would pass get-copy-limit (" + std::to_string(limit) + "); retry when transfers end";
}
std::string client_copy_limit(std::uint64_t held, std::uint64_t length, std::uint64_t limit) {
  return "ERR this client's DMA.GET copies hold " + std::to_string(held) + " bytes and this value's " +
         std::to_string(length) + " would pass get-copy-client-limit (" + std::to_string(limit) +
         "); retry when its transfers end";
}
std::string writes_paused() {
  return "TRYAGAIN writes are paused on this server (CLIENT PAUSE WRITE, a failover or a shutdown): the value "
         "was not stored; send DMA.SET again";
}
std::string slot_moved() {
  return "TRYAGAIN the key's slot left this node during the transfer: the value was not stored; send DMA.SET "
         "again (the cluster redirects it to the slot's owner)";
}
std::string cluster_down() { return "CLUSTERDOWN the cluster went down during the transfer: the value was not stored"; }
std::string cannot_block(std::string_view command) {
  return "ERR " + std::string(command) +
         " cannot run inside MULTI or a script: it blocks its client until the transfer completes";
}
std::string shutting_down() { return "ERR the dma module is shutting down"; }

}  // namespace errors

ErrorReply classify_error(std::string_view text) noexcept {
  const auto space = text.find(' ');
  const std::string_view code = text.substr(0, space);
  if (code == "NOHELLO") return ErrorReply::no_hello;
  if (code == "TRYAGAIN") return ErrorReply::try_again;
  if (code == "CLUSTERDOWN") return ErrorReply::cluster_down;
  if (code == "OOM") return ErrorReply::out_of_memory;
  if (code == "WRONGTYPE") return ErrorReply::wrong_type;
  if (code == "MOVED") return ErrorReply::moved;
  if (code == "ASK") return ErrorReply::ask;
  if (text == no_such_key_text) return ErrorReply::no_such_key;
  if (text.starts_with(transfer_failed_prefix)) return ErrorReply::transfer_failed;
  if (text.starts_with(crc_mismatch_prefix)) return ErrorReply::crc_mismatch;
  if (text.starts_with(value_prefix) && text.find(value_too_large_middle) != std::string_view::npos) {
    return ErrorReply::value_too_large;
  }
  if (text.starts_with(buffer_too_small_prefix) && text.find(buffer_too_small_middle) != std::string_view::npos) {
    return ErrorReply::buffer_too_small;
  }
  return ErrorReply::other;
}

int key_slot(std::string_view key) noexcept {
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  // CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection.
  std::uint16_t crc = 0;
  for (const char c : key) {
    crc = static_cast<std::uint16_t>(crc ^ (static_cast<std::uint16_t>(static_cast<unsigned char>(c)) << 8));
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    }
  }
  return crc & (cluster_slots - 1);
}

std::optional<Redirect> parse_redirect(std::string_view text) {
  Redirect redirect;
  std::size_t at = std::string_view::npos;
  for (std::size_t from = 0; from < text.size(); ++from) {
    if (from > 0 && text[from - 1] != ' ') continue;
    if (text.substr(from).starts_with("MOVED ")) {
      at = from + 6;
      break;
    }
    if (text.substr(from).starts_with("ASK ")) {
      redirect.ask = true;
      at = from + 4;
      break;
    }
  }
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(at);
  const auto space = rest.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto slot = parse_u64(rest.substr(0, space));
  if (!slot || *slot >= static_cast<std::uint64_t>(cluster_slots)) return std::nullopt;
  redirect.slot = static_cast<int>(*slot);
  rest = rest.substr(space + 1);
  rest = rest.substr(0, rest.find(' '));
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto port = parse_u64(rest.substr(colon + 1));
  if (!port || *port == 0 || *port > 65535) return std::nullopt;
  redirect.port = static_cast<std::uint16_t>(*port);
  std::string_view host = rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  redirect.host = std::string(host);
  return redirect;
}

void InfoText::section(std::string_view name) {
  if (!text_.empty()) text_ += "\r\n";
  text_ += "# ";
  text_ += name;
  text_ += "\r\n";
}

void InfoText::field(std::string_view name, std::string_view value) {
  text_ += name;
  text_ += ':';
  text_ += value;
  text_ += "\r\n";
}

void InfoText::field(std::string_view name, std::uint64_t value) {
  field(name, std::string_view(std::to_string(value)));
}

void InfoText::flag(std::string_view name, bool value) { field(name, std::string_view(value ? "yes" : "no")); }

std::string info_text(const InfoFields& f, InfoExtra extra, const void* context) {
  InfoText t;
  const auto more = [&](InfoSection section) {
    if (extra != nullptr) extra(section, t, context);
  };
  t.section("Server");
  t.field("server", f.server);
  t.field("libfabric_version", fabric_version());
  t.field("provider", f.provider);
  t.field("fabric_address", f.fabric_address);
  t.flag("any_fabric_host", f.any_fabric_host);
  t.field("max_value", f.max_value);
  t.field("get_confirmation", to_string(f.confirmation));
  more(InfoSection::server);
  t.section("Clients");
  t.field("dma_clients", f.dma_clients);
  t.field("hellos", f.hellos);
  t.field("hellos_rejected", f.hellos_rejected);
  t.field("hello_bindings", f.hello_bindings);
  t.field("hello_bindings_dropped", f.hello_bindings_dropped);
  t.field("no_hello", f.no_hello);
  more(InfoSection::clients);
  // Sections only some servers have: a header only when the server adds a field.
  for (const auto& [section, name] :
       {std::pair{InfoSection::keyspace, "Keyspace"}, std::pair{InfoSection::memory, "Memory"},
        std::pair{InfoSection::commands, "Commands"}}) {
    if (extra == nullptr) continue;
    InfoText own;
    extra(section, own, context);
    if (own.text().empty()) continue;
    t.section(name);
    more(section);
  }
  t.section("Transfers");
  t.field("outstanding", f.outstanding);
  t.field("dma_sets_in_flight", f.sets_in_flight);
  t.field("dma_gets_in_flight", f.gets_in_flight);
  t.field("transfers_ok", f.transfers_ok);
  t.field("transfers_failed", f.transfers_failed);
  t.field("transfers_timed_out", f.transfers_timed_out);
  t.field("crc_mismatches", f.crc_mismatches);
  t.field("bytes_read_from_clients", f.bytes_read);
  t.field("bytes_written_to_clients", f.bytes_written);
  t.field("gets_notified", f.gets_notified);
  more(InfoSection::transfers);
  if (f.service) {
    const auto& m = *f.service;
    t.section("Service");
    t.field("posted", m.posted);
    t.field("completed", m.completed);
    t.field("failed", m.failed);
    t.field("eagain", m.eagain);
    t.field("cq_reads", m.cq_reads);
    t.field("fd_wakeups", m.fd_wakeups);
    t.field("backstop_hits", m.backstop_hits);
    t.field("context_less_errors", m.context_less_errors);
    t.field("timed_out", m.timed_out);
    t.field("reconnects", m.reconnects);
    t.field("registrations", m.registrations);
    t.field("cache_entries", m.cache_entries);
    t.field("cache_bytes", m.cache_bytes);
    more(InfoSection::service);
  }
  return t.text();
}

}  // namespace dma::kv
