// Uniform multi-hop neighbour sampling without replacement over a CSC graph, with
// relabelling to local ids under the prefix convention (DESIGN.md, data model).
// One NeighborSampler is a reusable per-thread workspace: it allocates only its outputs.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "common/random.h"
#include "cpu/buffer_pool.h"
#include "cpu/node_map.h"

namespace morphpipe {

// The sampled computation graph of one mini-batch, input layer first.
struct SampledBlocks {
  at::Tensor input_nodes;                 // int64 [num_src of layer 0], global ids, seeds first
  std::vector<at::Tensor> block_indptrs;  // int64 [num_dst + 1] per layer
  std::vector<at::Tensor> block_indices;  // int64 [nnz] per layer, local source ids
  int64_t num_sampled_edges = 0;
};

class NeighborSampler {
 public:
  // `fanouts[h]` is the number of neighbours taken at hop h from the seeds (-1: all).
  NeighborSampler(at::Tensor indptr, at::Tensor indices, std::vector<int64_t> fanouts);

  // Samples the blocks of one batch; `rng_seed` alone decides the random choices.
  // Outputs come from `pool` (e.g. recycled pinned host memory).
  SampledBlocks sample(const int64_t* seeds, int64_t num_seeds, uint64_t rng_seed, BufferPool& pool);

  int64_t num_nodes() const { return num_nodes_; }

 private:
  template <typename index_t>
  void sample_hop(const index_t* indices, int64_t fanout, int64_t num_dst, Xoshiro256& rng,
                  int64_t* out_indptr, BufferPool& pool, at::Tensor& out_indices);

  int64_t local_id(int64_t node);

  at::Tensor indptr_;
  at::Tensor indices_;
  const int64_t* indptr_data_;
  int64_t num_nodes_;
  int64_t num_edges_;  // every neighbour range must lie in [0, num_edges_]
  std::vector<int64_t> fanouts_;

  NodeMap node_map_;
  std::vector<int64_t> nodes_;    // global id of every local id, in order of discovery
  std::vector<int64_t> chosen_;   // offsets picked for the current destination
  std::vector<int64_t> shuffle_;  // partial Fisher-Yates scratch for large fanouts
  std::vector<int64_t> begins_;   // start of each destination's neighbour list, this hop
};

// The shared topology check (common/sampler_checks.h) for the CPU sampler, which reads the topology
// from host memory: CPU tensors.
void check_cpu_topology(const at::Tensor& indptr, const at::Tensor& indices);

}  // namespace morphpipe
