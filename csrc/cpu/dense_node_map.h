// Relabelling map from global node id to local id as one array slot per node of the graph: a lookup is one
// memory access at the node's own id (no hashing, no probing), where NodeMap's open addressing scatters ids over
// a table twice the batch's size. For graphs small enough that a per-thread array of 4 bytes per node is cheap.
// Each slot holds the local id (24 bits: ids of a graph of at most kMaxNodes nodes) under an 8-bit generation
// stamp, so a clear is O(1) (bump the stamp) and the array is half the size a 64-bit slot would need: more of it
// stays in the cache, and relabelling is random reads of it.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace morphpipe {

class DenseNodeMap {
 public:
  static constexpr int kIdBits = 24;  // bits of a slot's local id; the other 8 hold the generation stamp
  // Graphs up to this many nodes get a DenseNodeMap per sampler thread (4 bytes each: at most 64 MiB a thread).
  static constexpr int64_t kMaxNodes = int64_t{1} << kIdBits;

  // Keys are node ids in [0, num_nodes). The slots come zeroed from calloc, so only pages a batch touches cost.
  explicit DenseNodeMap(int64_t num_nodes)
      : num_nodes_(num_nodes),
        slots_(static_cast<uint32_t*>(std::calloc(static_cast<size_t>(std::max<int64_t>(num_nodes, 1)),
                                                  sizeof(uint32_t)))) {
    TORCH_CHECK(slots_ != nullptr, "DenseNodeMap: could not allocate ", num_nodes * 4,
                " bytes for the relabelling array of ", num_nodes, " nodes");
  }

  // Forgets every entry; keeps the memory.
  void clear() {
    ++generation_;
    size_ = 0;
    if (generation_ == kGenerations) {  // stamp wrapped: wipe once every 255 clears
      std::memset(slots_.get(), 0, static_cast<size_t>(num_nodes_) * sizeof(uint32_t));
      generation_ = 1;
    }
  }

  // Returns the local id of `key`, inserting it as `candidate` (below kMaxNodes) when absent; `inserted` says which.
  int64_t insert(int64_t key, int64_t candidate, bool& inserted) {
    uint32_t& slot = slots_[key];
    if ((slot >> kIdBits) == generation_) {
      inserted = false;
      return static_cast<int64_t>(slot & kIdMask);
    }
    slot = (generation_ << kIdBits) | static_cast<uint32_t>(candidate);
    ++size_;
    inserted = true;
    return candidate;
  }

  // Hints the cache to load `key`'s slot for writing.
  void prefetch(int64_t key) const { __builtin_prefetch(slots_.get() + key, 1); }

  int64_t size() const { return size_; }

 private:
  static constexpr uint32_t kIdMask = (uint32_t{1} << kIdBits) - 1;
  static constexpr uint32_t kGenerations = uint32_t{1} << (32 - kIdBits);

  struct Free {
    void operator()(uint32_t* slots) const { std::free(slots); }
  };

  int64_t num_nodes_;
  std::unique_ptr<uint32_t[], Free> slots_;  // (generation << kIdBits) | local id; generation 0 never current
  uint32_t generation_ = 1;
  int64_t size_ = 0;
};

}  // namespace morphpipe
