// Relabelling map from global node id to local id as one array slot per node of the graph: a lookup is one
// memory access at the node's own id (no hashing, no probing), where NodeMap's open addressing scatters ids over
// a table twice the batch's size. For graphs small enough that a per-thread array of 8 bytes per node is cheap.
// Cleared in O(1) by bumping a generation stamp held in each slot beside the local id.
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
  // Graphs up to this many nodes get a DenseNodeMap per sampler thread (8 bytes each: at most 128 MiB a thread).
  static constexpr int64_t kMaxNodes = int64_t{1} << 24;

  // Keys are node ids in [0, num_nodes). The slots come zeroed from calloc, so only pages a batch touches cost.
  explicit DenseNodeMap(int64_t num_nodes)
      : num_nodes_(num_nodes),
        slots_(static_cast<uint64_t*>(std::calloc(static_cast<size_t>(std::max<int64_t>(num_nodes, 1)),
                                                  sizeof(uint64_t)))) {
    TORCH_CHECK(slots_ != nullptr, "DenseNodeMap: could not allocate ", num_nodes * 8,
                " bytes for the relabelling array of ", num_nodes, " nodes");
  }

  // Forgets every entry; keeps the memory.
  void clear() {
    ++generation_;
    size_ = 0;
    if (generation_ == 0) {  // stamp wrapped: wipe once every 2^32 clears
      std::memset(slots_.get(), 0, static_cast<size_t>(num_nodes_) * sizeof(uint64_t));
      generation_ = 1;
    }
  }

  // Returns the local id of `key`, inserting it as `candidate` when absent; `inserted` says which. Without a
  // branch on the outcome (the slot is written either way): whether a sampled neighbour is new is a coin flip
  // the branch predictor loses about as often as it wins.
  int64_t insert(int64_t key, int64_t candidate, bool& inserted) {
    uint64_t& slot = slots_[key];
    const uint64_t current = slot;
    inserted = static_cast<uint32_t>(current >> 32) != generation_;
    const uint64_t fresh = (static_cast<uint64_t>(generation_) << 32) | static_cast<uint32_t>(candidate);
    slot = inserted ? fresh : current;
    size_ += inserted;
    return static_cast<int32_t>(slot);
  }

  // Hints the cache to load `key`'s slot for writing.
  void prefetch(int64_t key) const { __builtin_prefetch(slots_.get() + key, 1); }
  // The same into L2 only (a first request from far ahead; `prefetch` brings the slot on to L1).
  void prefetch_l2(int64_t key) const { __builtin_prefetch(slots_.get() + key, 1, 2); }

  int64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint64_t* slots) const { std::free(slots); }
  };

  int64_t num_nodes_;
  std::unique_ptr<uint64_t[], Free> slots_;  // (generation << 32) | local id; generation 0 never current
  uint32_t generation_ = 1;
  int64_t size_ = 0;
};

}  // namespace morphpipe
