// Uniform multi-hop neighbour sampling without replacement over a heterogeneous graph (one CSC per relation,
// node types as contiguous ranges of one id space), with one relabelling per node type under the prefix
// convention: at every hop, the first sources of each type are that type's destinations, in order.
// One HeteroNeighborSampler is a reusable per-thread workspace: it allocates only its outputs.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "common/random.h"
#include "cpu/buffer_pool.h"
#include "cpu/dense_node_map.h"
#include "cpu/node_map.h"
#include "cpu/uninitialised_allocator.h"

namespace morphpipe {

// The sampled computation graph of one typed batch, input layer first.
struct SampledTypedBlocks {
  at::Tensor input_nodes;                         // global ids of the input layer's sources, type after type
  std::vector<at::Tensor> nodes;                  // per node type: its part of input_nodes (a view)
  std::vector<std::vector<at::Tensor>> indptrs;   // [layer][relation] int64 [num_dst of its destination type + 1]
  std::vector<std::vector<at::Tensor>> indices;   // [layer][relation] int64 local ids of its source type
  std::vector<std::vector<int64_t>> counts;       // [layer + 1][type] nodes per type: counts[l] are layer l's
                                                  // sources, counts[l + 1] its destinations; counts[layers]: seeds
};

class HeteroNeighborSampler {
 public:
  // fanouts[hop][relation] neighbours per destination at hop `hop` from the seeds (-1: all, 0: none).
  HeteroNeighborSampler(std::vector<int64_t> type_offsets, std::vector<int64_t> src_types,
                        std::vector<int64_t> dst_types, std::vector<at::Tensor> indptrs, std::vector<at::Tensor> indices,
                        std::vector<std::vector<int64_t>> fanouts);

  // Samples the blocks of one batch of seeds (global ids, any types, distinct); `rng_seed` alone decides the
  // random choices. Outputs come from `pool`.
  SampledTypedBlocks sample(const int64_t* seeds, int64_t num_seeds, uint64_t rng_seed, BufferPool& pool);

  int64_t num_types() const { return static_cast<int64_t>(type_offsets_.size()) - 1; }
  int64_t num_relations() const { return static_cast<int64_t>(src_types_.size()); }
  const std::vector<int64_t>& type_offsets() const { return type_offsets_; }

 private:
  // `sample` over one cleared relabelling map (DenseNodeMap or NodeMap: the same local ids either way).
  template <typename Map>
  SampledTypedBlocks sample_with(Map& map, const int64_t* seeds, int64_t num_seeds, uint64_t rng_seed,
                                 BufferPool& pool);
  template <typename index_t, typename Map>
  void sample_relation(size_t relation, const index_t* indices, Map& map, int64_t fanout, int64_t num_dst,
                       Xoshiro256& rng, int64_t* out_indptr, BufferPool& pool, at::Tensor& out_indices);
  int64_t type_of(int64_t node) const;

  std::vector<int64_t> type_offsets_;
  std::vector<int64_t> src_types_, dst_types_;
  std::vector<at::Tensor> indptrs_, indices_;
  std::vector<std::vector<int64_t>> fanouts_;

  std::optional<DenseNodeMap> dense_map_;     // global id -> local id within its type, for graphs of at most
                                              // DenseNodeMap::kMaxNodes nodes
  NodeMap node_map_;                          // the same map for larger graphs
  std::vector<std::vector<int64_t, UninitialisedAllocator<int64_t>>> nodes_;  // per type: global id of every
                                                                            // local id, in order of discovery
  std::vector<int64_t> chosen_;
  std::vector<int64_t> shuffle_;
  std::vector<int64_t> begins_;   // start of each destination's neighbour list, this relation
  std::vector<int64_t> degrees_;  // length of each destination's neighbour list, this relation
};

}  // namespace morphpipe
