// Open-addressing map from global node id to local id, used to relabel sampled nodes.
// Cleared in O(1) by bumping a generation stamp, so one map is reused for every batch
// a thread builds (no per-batch allocation, no per-edge allocation).
#pragma once

#include <cstdint>
#include <vector>

namespace morphpipe {

class NodeMap {
 public:
  explicit NodeMap(int64_t expected_size = 1 << 12) { reserve(expected_size); }

  // Forgets every entry; keeps the memory.
  void clear() {
    ++generation_;
    size_ = 0;
    if (generation_ == 0) {  // stamp wrapped: wipe once every 2^32 clears
      for (auto& slot : slots_) slot.generation = 0;
      generation_ = 1;
    }
  }

  // Makes room for `count` entries without rehashing.
  void reserve(int64_t count) {
    uint64_t capacity = 16;
    while (capacity < static_cast<uint64_t>(count) * 2) capacity <<= 1;
    if (capacity > slots_.size()) rehash(capacity);
  }

  // Returns the local id of `key`, inserting it as `candidate` when absent; `inserted` says which.
  // Local ids are below 2^31: one batch never holds that many nodes.
  int64_t insert(int64_t key, int64_t candidate, bool& inserted) {
    if (static_cast<uint64_t>(size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    uint64_t position = hash(key);
    while (true) {
      Slot& slot = slots_[position];
      if (slot.generation != generation_) {
        slot.key = key;
        slot.value = static_cast<int32_t>(candidate);
        slot.generation = generation_;
        ++size_;
        inserted = true;
        return candidate;
      }
      if (slot.key == key) {
        inserted = false;
        return slot.value;
      }
      position = (position + 1) & mask_;
    }
  }

  // The local id of `key`, or -1 when it is absent.
  int64_t find(int64_t key) const {
    uint64_t position = hash(key);
    while (true) {
      const Slot& slot = slots_[position];
      if (slot.generation != generation_) return -1;
      if (slot.key == key) return slot.value;
      position = (position + 1) & mask_;
    }
  }

  // Hints the cache to load the slot where `key` would start probing.
  void prefetch(int64_t key) const { __builtin_prefetch(&slots_[hash(key)]); }
  // The same into L2 only (a first request from far ahead).
  void prefetch_l2(int64_t key) const { __builtin_prefetch(&slots_[hash(key)], 0, 2); }

  int64_t size() const { return size_; }

 private:
  struct Slot {  // 16 bytes: four slots per cache line
    int64_t key;
    int32_t value;
    uint32_t generation;
  };
  static_assert(sizeof(Slot) == 16, "NodeMap::Slot should pack into 16 bytes");

  // Fibonacci hashing: the high bits of key * 2^64/phi spread consecutive and strided ids.
  uint64_t hash(int64_t key) const { return (static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> shift_; }

  void rehash(uint64_t capacity) {
    std::vector<Slot> old;
    old.swap(slots_);
    const uint32_t old_generation = generation_;
    slots_.assign(capacity, Slot{0, 0, 0});
    mask_ = capacity - 1;
    shift_ = 64 - __builtin_ctzll(capacity);
    generation_ = 1;
    size_ = 0;
    for (const Slot& slot : old) {
      if (slot.generation == old_generation && old_generation != 0) {
        bool inserted;
        insert(slot.key, slot.value, inserted);
      }
    }
  }

  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int shift_ = 60;
  uint32_t generation_ = 1;
  int64_t size_ = 0;
};

}  // namespace morphpipe
