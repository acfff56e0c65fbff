// Uniform multi-hop neighbour sampling on the CPU (NeighborSampler, behind CpuBatcher) and the op
// `morphpipe::sample_neighbors`, which samples one batch with it on the calling thread.
#include "cpu/neighbor_sampler.h"

#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/sampler_checks.h"
#include "common/sampling.h"
#include "cpu/choose_offsets.h"
#include "cpu/sampling_passes.h"

namespace morphpipe {

void check_cpu_topology(const at::Tensor& indptr, const at::Tensor& indices) {
  TORCH_CHECK(indptr.device().is_cpu() && indices.device().is_cpu(),
              "graph topology: indptr and indices must be CPU tensors for the CPU sampler, got ", indptr.device(),
              " and ", indices.device());
  check_topology(indptr, indices);
}

NeighborSampler::NeighborSampler(at::Tensor indptr, at::Tensor indices, std::vector<int64_t> fanouts)
    : indptr_(std::move(indptr)), indices_(std::move(indices)), fanouts_(std::move(fanouts)) {
  check_cpu_topology(indptr_, indices_);
  check_fanouts(fanouts_);
  indptr_data_ = indptr_.data_ptr<int64_t>();
  num_nodes_ = indptr_.numel() - 1;
  num_edges_ = indices_.numel();
  if (num_nodes_ <= DenseNodeMap::kMaxNodes) dense_map_.emplace(num_nodes_);
}

template <typename index_t>
void NeighborSampler::allowed_offsets(const index_t* neighbours, int64_t degree, int64_t node) {
  allowed_.clear();
  for (int64_t offset = 0; offset < degree; ++offset) {
    if (!exclusion_->contains(static_cast<int64_t>(neighbours[offset]), node)) allowed_.push_back(offset);
  }
}

template <typename index_t, typename Map>
void NeighborSampler::sample_hop(const index_t* indices, Map& map, int64_t fanout, int64_t num_dst, Xoshiro256& rng,
                                 int64_t* out_indptr, BufferPool& pool, at::Tensor& out_indices) {
  // The four passes of cpu/sampling_passes.h; with an edge exclusion, the filtered destinations' lists first.
  // Pass 1: how many neighbours each destination takes; list starts and degrees are kept for pass 2.
  begins_.resize(num_dst);
  degrees_.resize(num_dst);
  out_indptr[0] = 0;
  for (int64_t dst = 0; dst < num_dst; ++dst) {
    if (dst + kIndptrPrefetchL2 < num_dst) __builtin_prefetch(indptr_data_ + nodes_[dst + kIndptrPrefetchL2], 0, 2);
    if (dst + kIndptrPrefetch < num_dst) __builtin_prefetch(indptr_data_ + nodes_[dst + kIndptrPrefetch]);
    const int64_t node = nodes_[dst];
    const int64_t begin = indptr_data_[node];
    const int64_t end = indptr_data_[node + 1];
    // indptr[-1] == nnz alone does not bound each list: a range that starts below 0, runs backwards or
    // past nnz would make every read below leave the indices buffer, so each range is checked as it is read.
    TORCH_CHECK(begin >= 0 && begin <= end && end <= num_edges_, "indptr: node ", node,
                " has the neighbour range indptr[", node, "..", node + 1, "] = [", begin, ", ", end,
                "), which is not inside [0, ", num_edges_, "] and non-decreasing; fix: rebuild the CSC with "
                "build_csc(src, dst, num_nodes), and validate the graph with GraphStore.validate()");
    begins_[dst] = begin;
    degrees_[dst] = end - begin;
    int64_t degree = end - begin;
    if (dst < static_cast<int64_t>(filtered_.size()) && filtered_[dst]) {
      allowed_offsets(indices + begin, degree, node);
      degree = static_cast<int64_t>(allowed_.size());
    }
    const int64_t taken = (fanout < 0 || degree <= fanout) ? degree : fanout;
    out_indptr[dst + 1] = out_indptr[dst] + taken;
  }
  const int64_t num_edges = out_indptr[num_dst];
  TORCH_CHECK(static_cast<int64_t>(nodes_.size()) + num_edges < INT32_MAX,
              "one batch would hold more than 2^31 nodes; use a smaller batch_size or smaller fanouts");
  out_indices = pool.empty({num_edges}, at::kLong);
  int64_t* out = out_indices.data_ptr<int64_t>();
  // Pass 2: each destination's picks, as positions in `indices`, into `out`. Only seeds (the first destinations of
  // every hop) can have excluded edges; the rest take the pass without a check.
  const int64_t num_filtered = std::min(static_cast<int64_t>(filtered_.size()), num_dst);
  for (int64_t dst = 0; dst < num_filtered; ++dst) {
    const int64_t begin = begins_[dst];
    const int64_t degree = degrees_[dst];
    int64_t* picked = out + out_indptr[dst];
    const int64_t taken = out_indptr[dst + 1] - out_indptr[dst];
    if (filtered_[dst]) {
      allowed_offsets(indices + begin, degree, nodes_[dst]);
      const int64_t allowed = static_cast<int64_t>(allowed_.size());
      if (taken == allowed) {
        for (const int64_t offset : allowed_) *picked++ = begin + offset;
      } else {
        choose_offsets(allowed, taken, rng, chosen_, shuffle_);
        for (const int64_t pick : chosen_) *picked++ = begin + allowed_[pick];
      }
    } else {
      pick_positions(begin, degree, taken, rng, picked, chosen_, shuffle_);
    }
  }
  pick_all_positions(begins_.data() + num_filtered, degrees_.data() + num_filtered, out_indptr + num_filtered,
                     num_dst - num_filtered, rng, out, chosen_, shuffle_);
  // Pass 3: the picked neighbours' global ids, read at their positions.
  for (int64_t edge = 0; edge < num_edges; ++edge) {
    if (edge + kPickPrefetchL2 < num_edges) __builtin_prefetch(indices + out[edge + kPickPrefetchL2], 0, 2);
    if (edge + kPickPrefetch < num_edges) __builtin_prefetch(indices + out[edge + kPickPrefetch]);
    const int64_t position = out[edge];
    const int64_t neighbour = static_cast<int64_t>(indices[position]);
    TORCH_CHECK(neighbour >= 0 && neighbour < num_nodes_, "graph topology: indices[", position, "] holds node id ",
                neighbour, " outside [0, ", num_nodes_, "); validate the graph (GraphStore.validate) before sampling");
    out[edge] = neighbour;
  }
  // Pass 4: relabel in edge order.
  const int64_t known = static_cast<int64_t>(nodes_.size());
  nodes_.resize(known + num_edges);
  nodes_.resize(relabel_in_order(map, out, num_edges, nodes_.data(), known));
}

SampledBlocks NeighborSampler::sample(const int64_t* seeds, int64_t num_seeds, uint64_t rng_seed,
                                      BufferPool& pool, const EdgeExclusion* exclusion) {
  exclusion_ = (exclusion != nullptr && !exclusion->empty()) ? exclusion : nullptr;
  return with_cleared_map(dense_map_, node_map_, num_seeds,
                          [&](auto& map) { return sample_with(map, seeds, num_seeds, rng_seed, pool); });
}

template <typename Map>
SampledBlocks NeighborSampler::sample_with(Map& map, const int64_t* seeds, int64_t num_seeds, uint64_t rng_seed,
                                           BufferPool& pool) {
  Xoshiro256 rng(rng_seed);
  nodes_.clear();
  filtered_.assign(exclusion_ != nullptr ? num_seeds : 0, 0);
  for (int64_t i = 0; i < num_seeds; ++i) {
    const int64_t seed = seeds[i];
    check_seed_id(i, seed, num_nodes_);
    bool inserted;
    map.insert(seed, i, inserted);
    check_seed_first(i, seed, inserted);
    nodes_.push_back(seed);
    if (exclusion_ != nullptr) filtered_[i] = exclusion_->targets(seed);
  }

  const size_t num_hops = fanouts_.size();
  SampledBlocks result;
  result.block_indptrs.resize(num_hops);
  result.block_indices.resize(num_hops);
  for (size_t hop = 0; hop < num_hops; ++hop) {
    const size_t layer = num_hops - 1 - hop;  // hop 0 (around the seeds) is the last layer
    const int64_t num_dst = static_cast<int64_t>(nodes_.size());
    at::Tensor indptr = pool.empty({num_dst + 1}, at::kLong);
    if (indices_.scalar_type() == at::kInt) {
      sample_hop(indices_.data_ptr<int32_t>(), map, fanouts_[hop], num_dst, rng, indptr.data_ptr<int64_t>(),
                 pool, result.block_indices[layer]);
    } else {
      sample_hop(indices_.data_ptr<int64_t>(), map, fanouts_[hop], num_dst, rng, indptr.data_ptr<int64_t>(),
                 pool, result.block_indices[layer]);
    }
    result.num_sampled_edges += result.block_indices[layer].numel();
    result.block_indptrs[layer] = std::move(indptr);
  }
  result.input_nodes = pool.empty({static_cast<int64_t>(nodes_.size())}, at::kLong);
  std::memcpy(result.input_nodes.data_ptr<int64_t>(), nodes_.data(), nodes_.size() * sizeof(int64_t));
  return result;
}

namespace {

// Op `morphpipe::sample_neighbors`: samples the blocks of one batch on the calling thread.
std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> sample_neighbors_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds, at::IntArrayRef fanouts,
    int64_t seed) {
  check_seeds(seeds, "morphpipe::sample_neighbors");
  const at::Tensor seeds_contiguous = seeds.contiguous();
  NeighborSampler sampler(indptr.contiguous(), indices.contiguous(), fanouts.vec());
  auto allocator = BufferPool::create(at::TensorOptions(), /*max_idle=*/0);
  SampledBlocks blocks = sampler.sample(seeds_contiguous.data_ptr<int64_t>(), seeds_contiguous.numel(),
                                        splitmix64(static_cast<uint64_t>(seed)), *allocator);
  return {blocks.input_nodes, blocks.block_indptrs, blocks.block_indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) {
  m.impl("sample_neighbors", &sample_neighbors_cpu);
}

}  // namespace morphpipe
