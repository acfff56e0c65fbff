// Typed (heterogeneous) neighbour sampling on the CPU: HeteroNeighborSampler, behind HeteroCpuBatcher.
#include "cpu/hetero_sampler.h"

#include <algorithm>
#include <cstring>

#include "common/hetero_sampler_checks.h"
#include "common/sampler_checks.h"
#include "cpu/sampling_passes.h"

namespace morphpipe {

HeteroNeighborSampler::HeteroNeighborSampler(std::vector<int64_t> type_offsets, std::vector<int64_t> src_types,
                                             std::vector<int64_t> dst_types, std::vector<at::Tensor> indptrs,
                                             std::vector<at::Tensor> indices, std::vector<std::vector<int64_t>> fanouts)
    : type_offsets_(std::move(type_offsets)),
      src_types_(std::move(src_types)),
      dst_types_(std::move(dst_types)),
      indptrs_(std::move(indptrs)),
      indices_(std::move(indices)),
      fanouts_(std::move(fanouts)) {
  check_typed_topology(type_offsets_, src_types_, dst_types_, indptrs_, indices_);
  check_typed_fanouts(fanouts_, src_types_.size());
  nodes_.resize(type_offsets_.size() - 1);
  if (type_offsets_.back() <= DenseNodeMap::kMaxNodes) dense_map_.emplace(type_offsets_.back());
}

int64_t HeteroNeighborSampler::type_of(int64_t node) const {
  return static_cast<int64_t>(std::upper_bound(type_offsets_.begin(), type_offsets_.end(), node) -
                              type_offsets_.begin()) - 1;
}

template <typename index_t, typename Map>
void HeteroNeighborSampler::sample_relation(size_t relation, const index_t* indices, Map& map, int64_t fanout,
                                            int64_t num_dst, Xoshiro256& rng, int64_t* out_indptr, BufferPool& pool,
                                            at::Tensor& out_indices) {
  const int64_t* indptr = indptrs_[relation].data_ptr<int64_t>();
  const int64_t num_edges = indices_[relation].numel();
  const int64_t dst_start = type_offsets_[dst_types_[relation]];
  const int64_t src_type = src_types_[relation];
  const int64_t src_start = type_offsets_[src_type];
  const int64_t num_src_nodes = type_offsets_[src_type + 1] - src_start;
  const int64_t* dst_nodes = nodes_[dst_types_[relation]].data();  // read in passes 1 and 2, before pass 4 grows it
  // The four passes of cpu/sampling_passes.h.
  // Pass 1: how many neighbours each destination takes (each range checked as it is read).
  begins_.resize(num_dst);
  degrees_.resize(num_dst);
  out_indptr[0] = 0;
  for (int64_t dst = 0; dst < num_dst; ++dst) {
    if (dst + kIndptrPrefetchL2 < num_dst)
      __builtin_prefetch(indptr + dst_nodes[dst + kIndptrPrefetchL2] - dst_start, 0, 2);
    if (dst + kIndptrPrefetch < num_dst) __builtin_prefetch(indptr + dst_nodes[dst + kIndptrPrefetch] - dst_start);
    const int64_t local = dst_nodes[dst] - dst_start;
    const int64_t begin = indptr[local];
    const int64_t end = indptr[local + 1];
    TORCH_CHECK(begin >= 0 && begin <= end && end <= num_edges, "relation ", relation, " indptr: node ", local,
                " of its destination type has the neighbour range [", begin, ", ", end, "), which is not inside [0, ",
                num_edges, "] and non-decreasing; validate the graph (HeteroGraphStore.validate)");
    const int64_t degree = end - begin;
    const int64_t taken = (fanout < 0 || degree <= fanout) ? degree : fanout;
    begins_[dst] = begin;
    degrees_[dst] = degree;
    out_indptr[dst + 1] = out_indptr[dst] + taken;
  }
  const int64_t num_picks = out_indptr[num_dst];
  std::vector<int64_t, UninitialisedAllocator<int64_t>>& src_nodes = nodes_[src_type];
  TORCH_CHECK(static_cast<int64_t>(src_nodes.size()) + num_picks < INT32_MAX,
              "one batch would hold more than 2^31 nodes of one type; use a smaller batch_size or smaller fanouts");
  out_indices = pool.empty({num_picks}, at::kLong);
  int64_t* out = out_indices.data_ptr<int64_t>();
  // Pass 2: each destination's picks, as positions in `indices`, into `out`.
  pick_all_positions(begins_.data(), degrees_.data(), out_indptr, num_dst, rng, out, chosen_, shuffle_);
  // Pass 3: the picked neighbours' ids (global), read at their positions.
  for (int64_t edge = 0; edge < num_picks; ++edge) {
    if (edge + kPickPrefetchL2 < num_picks) __builtin_prefetch(indices + out[edge + kPickPrefetchL2], 0, 2);
    if (edge + kPickPrefetch < num_picks) __builtin_prefetch(indices + out[edge + kPickPrefetch]);
    const int64_t position = out[edge];
    const int64_t neighbour = static_cast<int64_t>(indices[position]);
    TORCH_CHECK(neighbour >= 0 && neighbour < num_src_nodes, "relation ", relation, " indices[", position,
                "] holds source id ", neighbour, " outside its source type's local ids [0, ", num_src_nodes,
                "); validate the graph (HeteroGraphStore.validate) before sampling");
    out[edge] = neighbour + src_start;
  }
  // Pass 4: relabel within the source type in edge order.
  const int64_t known = static_cast<int64_t>(src_nodes.size());
  src_nodes.resize(known + num_picks);
  src_nodes.resize(relabel_in_order(map, out, num_picks, src_nodes.data(), known));
}

SampledTypedBlocks HeteroNeighborSampler::sample(const int64_t* seeds, int64_t num_seeds, uint64_t rng_seed,
                                                 BufferPool& pool) {
  return with_cleared_map(dense_map_, node_map_, num_seeds,
                          [&](auto& map) { return sample_with(map, seeds, num_seeds, rng_seed, pool); });
}

template <typename Map>
SampledTypedBlocks HeteroNeighborSampler::sample_with(Map& map, const int64_t* seeds, int64_t num_seeds,
                                                      uint64_t rng_seed, BufferPool& pool) {
  Xoshiro256 rng(rng_seed);
  for (auto& nodes : nodes_) nodes.clear();
  const int64_t num_nodes = type_offsets_.back();
  for (int64_t i = 0; i < num_seeds; ++i) {
    const int64_t seed = seeds[i];
    check_seed_id(i, seed, num_nodes);
    auto& typed = nodes_[type_of(seed)];
    bool inserted;
    map.insert(seed, static_cast<int64_t>(typed.size()), inserted);
    check_seed_first(i, seed, inserted);
    typed.push_back(seed);
  }
  const size_t num_hops = fanouts_.size();
  const size_t num_types = nodes_.size();
  SampledTypedBlocks result;
  result.indptrs.resize(num_hops);
  result.indices.resize(num_hops);
  result.counts.assign(num_hops + 1, std::vector<int64_t>(num_types));
  auto record_counts = [&](std::vector<int64_t>& counts) {
    for (size_t t = 0; t < num_types; ++t) counts[t] = static_cast<int64_t>(nodes_[t].size());
  };
  record_counts(result.counts[num_hops]);
  for (size_t hop = 0; hop < num_hops; ++hop) {
    const size_t layer = num_hops - 1 - hop;  // hop 0 (around the seeds) is the last layer
    const std::vector<int64_t> num_dst = result.counts[layer + 1];  // frozen: nodes found this hop are not expanded
    result.indptrs[layer].resize(src_types_.size());
    result.indices[layer].resize(src_types_.size());
    for (size_t r = 0; r < src_types_.size(); ++r) {
      const int64_t dst_count = num_dst[dst_types_[r]];
      at::Tensor indptr = pool.empty({dst_count + 1}, at::kLong);
      const int64_t fanout = fanouts_[hop][r];
      if (fanout == 0) {
        std::fill_n(indptr.data_ptr<int64_t>(), dst_count + 1, 0);
        result.indices[layer][r] = pool.empty({0}, at::kLong);
      } else if (indices_[r].scalar_type() == at::kInt) {
        sample_relation(r, indices_[r].data_ptr<int32_t>(), map, fanout, dst_count, rng, indptr.data_ptr<int64_t>(),
                        pool, result.indices[layer][r]);
      } else {
        sample_relation(r, indices_[r].data_ptr<int64_t>(), map, fanout, dst_count, rng, indptr.data_ptr<int64_t>(),
                        pool, result.indices[layer][r]);
      }
      result.indptrs[layer][r] = std::move(indptr);
    }
    record_counts(result.counts[layer]);
  }
  // One buffer, type after type (what the batch's input_nodes is), so that no concatenation follows.
  int64_t total = 0;
  for (const auto& nodes : nodes_) total += static_cast<int64_t>(nodes.size());
  result.input_nodes = pool.empty({total}, at::kLong);
  result.nodes.resize(num_types);
  int64_t offset = 0;
  for (size_t t = 0; t < num_types; ++t) {
    const int64_t count = static_cast<int64_t>(nodes_[t].size());
    result.nodes[t] = result.input_nodes.narrow(0, offset, count);
    std::memcpy(result.nodes[t].data_ptr<int64_t>(), nodes_[t].data(), count * sizeof(int64_t));
    offset += count;
  }
  return result;
}

}  // namespace morphpipe
