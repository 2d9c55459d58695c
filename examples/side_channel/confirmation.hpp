// What tells a DMA.GET's client that the value has landed in its buffer: the server's reply, or a
// notification at the client's Target carrying the token the client sent. Shared by dma-kv-server,
// the module and dma-kv-client; docs/side-channel.md ("Confirmation") has the protocol.
#pragma once

#include <dma/endpoint.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kv {

/// What a server tells its client, in the fourth element of the DMA.HELLO reply.
enum class Confirmation {
  /// The DMA.GET reply comes once the bytes have landed (the provider confirms delivery: tcp, shm).
  reply,
  /// The reply comes once the server's write has completed, which does not say the bytes have
  /// landed (efa-direct): the client waits for its Target's notification carrying its token.
  notification,
};

/// A token travels as the write's immediate data; efa-direct carries 4 bytes of it.
inline constexpr std::uint64_t max_token = UINT32_MAX;

inline std::string_view to_string(Confirmation confirmation) noexcept {
  return confirmation == Confirmation::reply ? "reply" : "notification";
}

/// "reply" or "notification"; nullopt for anything else.
inline std::optional<Confirmation> parse_confirmation(std::string_view text) noexcept {
  if (text == "reply") return Confirmation::reply;
  if (text == "notification") return Confirmation::notification;
  return std::nullopt;
}

/// A server's setting: "auto" (nullopt) or one of the two. False for anything else.
inline bool parse_confirmation_setting(std::string_view text, std::optional<Confirmation>& setting) noexcept {
  if (text == "auto") {
    setting.reset();
    return true;
  }
  const auto parsed = parse_confirmation(text);
  if (parsed) setting = parsed;
  return parsed.has_value();
}

/// The setting applied to an open endpoint: auto means a notification exactly where a completed
/// write does not say the bytes have landed (EndpointInfo::delivery_confirmed).
inline Confirmation resolve_confirmation(std::optional<Confirmation> setting, const dma::EndpointInfo& info) noexcept {
  return setting.value_or(info.delivery_confirmed ? Confirmation::reply : Confirmation::notification);
}

/// Empty when the endpoint can carry a token as immediate data; otherwise why not.
inline std::string check_token_room(const dma::EndpointInfo& info) {
  if (info.cq_data_size >= 4) return {};
  return "the provider " + info.provider + " carries " + std::to_string(info.cq_data_size) +
         " bytes of immediate data; a DMA.GET notification token needs 4";
}

}  // namespace kv
