// Uniform multi-hop neighbour sampling without replacement over a CSC graph, with
// relabelling to local ids under the prefix convention (DESIGN.md, data model).
// One NeighborSampler is a reusable per-thread workspace: it allocates only its outputs.
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

// The sampled computation graph of one mini-batch, input layer first.
struct SampledBlocks {
  at::Tensor input_nodes;                 // int64 [num_src of layer 0], global ids, seeds first
  std::vector<at::Tensor> block_indptrs;  // int64 [num_dst + 1] per layer
  std::vector<at::Tensor> block_indices;  // int64 [nnz] per layer, local source ids
  int64_t num_sampled_edges = 0;
};

// Edges src -> dst (global ids) that sampling must not traverse: an edge batch's own positive edges (and their
// reverses on an undirected graph), so a model never reads the edge it is asked to predict. Reused per batch.
class EdgeExclusion {
 public:
  // Forgets every edge; keys are dst * num_nodes + src (num_nodes < 2^31.5, so they fit in int64).
  void reset(int64_t num_nodes) {
    num_nodes_ = num_nodes;
    pairs_.clear();
    targets_.clear();
  }
  void add(int64_t src, int64_t dst) {
    bool inserted;
    pairs_.insert(dst * num_nodes_ + src, 0, inserted);
    targets_.insert(dst, 0, inserted);
  }
  bool contains(int64_t src, int64_t dst) const { return pairs_.find(dst * num_nodes_ + src) >= 0; }
  // True when some excluded edge ends at `dst` (only those destinations' lists need filtering).
  bool targets(int64_t dst) const { return targets_.find(dst) >= 0; }
  bool empty() const { return pairs_.size() == 0; }

 private:
  int64_t num_nodes_ = 0;
  NodeMap pairs_;
  NodeMap targets_;
};

class NeighborSampler {
 public:
  // `fanouts[h]` is the number of neighbours taken at hop h from the seeds (-1: all).
  NeighborSampler(at::Tensor indptr, at::Tensor indices, std::vector<int64_t> fanouts);

  // Samples the blocks of one batch; `rng_seed` alone decides the random choices.
  // Outputs come from `pool` (e.g. recycled pinned host memory). With `exclusion`, whose edges all end
  // at seeds, no block holds an excluded edge: it is left out of its destination's list before sampling.
  SampledBlocks sample(const int64_t* seeds, int64_t num_seeds, uint64_t rng_seed, BufferPool& pool,
                       const EdgeExclusion* exclusion = nullptr);

  int64_t num_nodes() const { return num_nodes_; }

 private:
  // `sample` over one cleared relabelling map (DenseNodeMap or NodeMap: the same local ids either way).
  template <typename Map>
  SampledBlocks sample_with(Map& map, const int64_t* seeds, int64_t num_seeds, uint64_t rng_seed, BufferPool& pool);

  template <typename index_t, typename Map>
  void sample_hop(const index_t* indices, Map& map, int64_t fanout, int64_t num_dst, Xoshiro256& rng,
                  int64_t* out_indptr, BufferPool& pool, at::Tensor& out_indices);

  // Offsets in [0, degree) of `node`'s neighbours whose edge to it is not excluded, into allowed_.
  template <typename index_t>
  void allowed_offsets(const index_t* neighbours, int64_t degree, int64_t node);

  at::Tensor indptr_;
  at::Tensor indices_;
  const int64_t* indptr_data_;
  int64_t num_nodes_;
  int64_t num_edges_;  // every neighbour range must lie in [0, num_edges_]
  std::vector<int64_t> fanouts_;

  std::optional<DenseNodeMap> dense_map_;  // the relabelling map when the graph has at most kMaxNodes nodes
  NodeMap node_map_;                       // the relabelling map otherwise
  std::vector<int64_t, UninitialisedAllocator<int64_t>> nodes_;  // global id of every local id, in discovery order
  std::vector<int64_t> chosen_;   // offsets picked for the current destination
  std::vector<int64_t> shuffle_;  // partial Fisher-Yates scratch for large fanouts
  std::vector<int64_t> begins_;   // start of each destination's neighbour list, this hop
  std::vector<int64_t> degrees_;  // length of each destination's neighbour list, this hop
  const EdgeExclusion* exclusion_ = nullptr;  // this batch's excluded edges, or null
  std::vector<uint8_t> filtered_;  // per seed (local id): some excluded edge ends there
  std::vector<int64_t> allowed_;   // offsets left after exclusion, for the current destination
};

// The shared topology check (common/sampler_checks.h) for the CPU sampler, which reads the topology
// from host memory: CPU tensors.
void check_cpu_topology(const at::Tensor& indptr, const at::Tensor& indices);

}  // namespace morphpipe
