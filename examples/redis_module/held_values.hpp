// The values DMA.SET stored that the module still holds a reference to, per database and key.
// redis-server 7.0's StringSet keeps the very string the module gives it, so while the module
// holds one more reference the string's refcount stays above 1, and a string shared that way is
// never changed in place: APPEND, SETRANGE and SETBIT copy it first (dbUnshareStringValue), and
// DEL, an overwrite, expiry or eviction only drop the key space's reference. A DMA.GET whose key
// still holds that string can therefore write straight from it. Main thread only.
#pragma once

#include "module_api.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dma_module {

class HeldValues {
 public:
  struct Value {
    rm::String* string = nullptr;  ///< one reference, the module's
    std::size_t length = 0;
    std::uint32_t crc = 0;  ///< CRC-32C of the bytes, computed when they arrived
  };

  /// `release` drops one reference to a string (RedisModule_FreeString); tests pass a fake.
  explicit HeldValues(std::function<void(rm::String*)> release) : release_(std::move(release)) {}
  ~HeldValues() { clear(); }
  HeldValues(const HeldValues&) = delete;
  HeldValues& operator=(const HeldValues&) = delete;

  /// Takes over one reference to `value.string` as what `key` of `db` holds; releases the value
  /// held for that key before, if any.
  void hold(int db, std::string_view key, Value value);
  /// What is held for `key` of `db`, or null.
  const Value* find(int db, std::string_view key) const;
  /// Releases what is held for `key` of `db`, if anything.
  void release(int db, std::string_view key);
  /// Stops holding what is held for `key` of `db` and hands it over, reference included; nullopt
  /// when nothing is.
  std::optional<Value> take(int db, std::string_view key);
  /// Releases everything held for `db`, or for every database when `db` is -1.
  void release_db(int db);
  /// SWAPDB: the keys of `a` and `b` trade places.
  void swap_dbs(int a, int b);
  void clear() { release_db(-1); }

  std::size_t count() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  using Keys = std::unordered_map<std::string, Value, Hash, std::equal_to<>>;

  Keys* keys_of(int db);
  void drop(const Value& value);

  std::function<void(rm::String*)> release_;
  std::vector<Keys> dbs_;
  std::size_t count_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace dma_module
