// Edge mini-batches for link prediction: a batch of training positives (edge ids), k corrupted destinations per
// positive (uniform, or by a weight such as in-degree^0.75), every endpoint a seed under one relabelling, and
// the neighbourhood of all seeds sampled in one pass with the batch's own positives (and their reverses on an
// undirected graph) left out of message passing. Behind the CpuBatcher's edge task and the op sample_edge_batch.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "cpu/buffer_pool.h"
#include "cpu/neighbor_sampler.h"
#include "cpu/node_map.h"

namespace morphpipe {

// What an edge batch is drawn from and how (shared, read-only, by every worker).
struct EdgeTask {
  at::Tensor pair_src;      // int64 [E]: training positive i is pair_src[i] -> pair_dst[i]
  at::Tensor pair_dst;      // int64 [E]
  int64_t num_negatives = 0;  // corrupted destinations per positive
  at::Tensor negative_cdf;  // float64 [N] cumulative corruption weights; empty: uniform over the nodes
  bool exclude = true;      // leave the batch's positives out of message passing
  bool undirected = false;  // ... and their reverses
  bool reject_positives = false;  // redraw a negative that is an edge of the topology (or the source itself)
};

// One edge batch before feature gathering: seeds (every endpoint once, sources and destinations of the
// positives first, in order of appearance), the pairs in local ids of the seeds, and the sampled blocks.
struct EdgeSample {
  at::Tensor edge_ids;      // int64 [B]
  at::Tensor seeds;         // int64 [S], global ids
  at::Tensor src;           // int64 [B], local ids
  at::Tensor dst;           // int64 [B]
  at::Tensor negative_dst;  // int64 [B, k]
  SampledBlocks blocks;
};

// A reusable per-thread workspace that builds edge batches; allocates only its outputs.
class EdgeBatchBuilder {
 public:
  EdgeBatchBuilder(const EdgeTask& task, at::Tensor indptr, at::Tensor indices, std::vector<int64_t> fanouts);

  // The batch of the positives `edge_ids[0..count)`; `rng_seed` alone decides the negatives and the sampling.
  EdgeSample build(const int64_t* edge_ids, int64_t count, uint64_t rng_seed, BufferPool& pool);

 private:
  int64_t seed_id(int64_t node);
  int64_t draw_negative(int64_t source, Xoshiro256& rng);
  bool is_edge(int64_t src, int64_t dst) const;

  const EdgeTask& task_;
  at::Tensor indptr_, indices_;
  int64_t num_nodes_;
  NeighborSampler sampler_;
  NodeMap seed_map_;
  std::vector<int64_t> seeds_;
  EdgeExclusion exclusion_;
};

}  // namespace morphpipe
