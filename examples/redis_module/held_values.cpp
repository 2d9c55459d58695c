#include "held_values.hpp"

#include <algorithm>
#include <utility>

namespace dma_module {

HeldValues::Keys* HeldValues::keys_of(int db) {
  if (db < 0) return nullptr;
  if (static_cast<std::size_t>(db) >= dbs_.size()) dbs_.resize(static_cast<std::size_t>(db) + 1);
  return &dbs_[static_cast<std::size_t>(db)];
}

void HeldValues::drop(const Value& value) {
  --count_;
  bytes_ -= value.length;
  release_(value.string);
}

void HeldValues::hold(int db, std::string_view key, Value value) {
  Keys* keys = keys_of(db);
  if (keys == nullptr) {
    release_(value.string);
    return;
  }
  ++count_;
  bytes_ += value.length;
  if (auto it = keys->find(key); it != keys->end()) {
    drop(std::exchange(it->second, value));
  } else {
    keys->emplace(std::string(key), value);
  }
}

const HeldValues::Value* HeldValues::find(int db, std::string_view key) const {
  if (db < 0 || static_cast<std::size_t>(db) >= dbs_.size()) return nullptr;
  const Keys& keys = dbs_[static_cast<std::size_t>(db)];
  const auto it = keys.find(key);
  return it == keys.end() ? nullptr : &it->second;
}

void HeldValues::release(int db, std::string_view key) {
  if (auto value = take(db, key)) release_(value->string);
}

std::optional<HeldValues::Value> HeldValues::take(int db, std::string_view key) {
  if (db < 0 || static_cast<std::size_t>(db) >= dbs_.size()) return std::nullopt;
  Keys& keys = dbs_[static_cast<std::size_t>(db)];
  const auto it = keys.find(key);
  if (it == keys.end()) return std::nullopt;
  const Value value = it->second;
  keys.erase(it);
  --count_;
  bytes_ -= value.length;
  return value;
}

void HeldValues::release_db(int db) {
  for (std::size_t i = 0; i < dbs_.size(); ++i) {
    if (db != -1 && static_cast<std::size_t>(db) != i) continue;
    Keys keys = std::exchange(dbs_[i], {});
    for (const auto& [key, value] : keys)
      drop(value);
  }
}

void HeldValues::swap_dbs(int a, int b) {
  if (a < 0 || b < 0) return;
  keys_of(std::max(a, b));  // both exist from here on
  std::swap(dbs_[static_cast<std::size_t>(a)], dbs_[static_cast<std::size_t>(b)]);
}

}  // namespace dma_module
