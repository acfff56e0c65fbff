// Argument checks of neighbour sampling (sample_neighbors, and the CUDA-only sample_neighbors_cached),
// shared by the CPU sampler (cpu/neighbor_sampler.cpp, also behind CpuBatcher) and the GPU sampler
// (cuda/neighbor_sampler.cu) so that both refuse a bad argument with the same message. Node ids are
// checked as the samplers read them.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

namespace morphpipe {

// The graph topology: indptr int64 [num_nodes + 1], indices int32 or int64 [nnz], both contiguous, and
// indptr[-1] == nnz (one read, from host or device memory). Each neighbour range is checked as it is read.
inline void check_topology(const at::Tensor& indptr, const at::Tensor& indices) {
  TORCH_CHECK(indptr.dim() == 1 && indptr.numel() >= 1,
              "graph topology: indptr must be 1-D with num_nodes + 1 entries, got shape ", indptr.sizes());
  TORCH_CHECK(indptr.scalar_type() == at::kLong, "graph topology: indptr must be int64, got ",
              indptr.scalar_type(), "; convert with indptr.long()");
  TORCH_CHECK(indices.dim() == 1, "graph topology: indices must be 1-D, got shape ", indices.sizes());
  TORCH_CHECK(indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong,
              "graph topology: indices must be int32 or int64, got ", indices.scalar_type());
  TORCH_CHECK(indptr.is_contiguous() && indices.is_contiguous(),
              "graph topology: indptr and indices must be contiguous; call .contiguous()");
  const int64_t last = indptr.device().is_cpu() ? indptr.data_ptr<int64_t>()[indptr.numel() - 1]
                                                : indptr[indptr.numel() - 1].item<int64_t>();
  TORCH_CHECK(last == indices.numel(), "graph topology: indptr[-1] = ", last, " but indices has ", indices.numel(),
              " entries; rebuild the CSC");
}

// Each fanout is -1 (all neighbours) or positive, and there is at least one hop.
// An epoch's seed order and batch size, checked; returns its batch count (the last batch short, or dropped).
inline int64_t epoch_batch_count(const at::Tensor& order, int64_t batch_size, bool drop_last) {
  TORCH_CHECK(order.dim() == 1 && order.scalar_type() == at::kLong,
              "order: expected a 1-D int64 tensor of seed ids, got ", order.scalar_type());
  TORCH_CHECK(batch_size >= 1, "batch_size: need at least 1 seed per batch, got ", batch_size);
  const int64_t num_seeds = order.numel();
  return drop_last ? num_seeds / batch_size : (num_seeds + batch_size - 1) / batch_size;
}

// Where a resumed epoch starts: a batch index in [0, num_batches] (num_batches: nothing left to build).
inline void check_first_batch(int64_t first_batch, int64_t num_batches) {
  TORCH_CHECK(first_batch >= 0 && first_batch <= num_batches, "first_batch: ", first_batch, " is outside [0, ",
              num_batches, "], the epoch's batches; give the index of the first batch to build");
}

inline void check_fanouts(at::IntArrayRef fanouts) {
  TORCH_CHECK(!fanouts.empty(), "fanouts: need at least one hop, e.g. [15, 10, 5]");
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    TORCH_CHECK(fanouts[hop] == -1 || fanouts[hop] > 0, "fanouts[", hop, "] = ", fanouts[hop],
                ": a fanout is a positive neighbour count or -1 for all neighbours");
  }
}

// The seeds of one batch: a 1-D int64 tensor of node ids.
inline void check_seeds(const at::Tensor& seeds, const char* op) {
  TORCH_CHECK(seeds.dim() == 1 && seeds.scalar_type() == at::kLong, op,
              ": seeds must be a 1-D int64 tensor of node ids, got ", seeds.scalar_type(), " of shape ", seeds.sizes(),
              "; convert with seeds.long()");
}

// Seed `position` of a batch, `value`, is a node id in [0, num_nodes).
inline void check_seed_id(int64_t position, int64_t value, int64_t num_nodes) {
  TORCH_CHECK(value >= 0 && value < num_nodes, "seeds[", position, "] = ", value, " is not a node id in [0, ",
              num_nodes, "); pass ids of nodes in the graph");
}

// Seed `position` of a batch, `value`, repeats no earlier seed of the batch (`first` is false for a repeat).
inline void check_seed_first(int64_t position, int64_t value, bool first) {
  TORCH_CHECK(first, "seeds[", position, "] = ", value,
              " repeats an earlier seed of the same batch; seeds of one batch must be distinct");
}

// sample_neighbors_cached's adjacency cache (when cache_slot is not empty): cache_slot int32 [num_nodes],
// cache_indptr int64 [num_cached + 1] and cache_indices of indices' dtype, all in device memory.
inline void check_adjacency_cache(const at::Tensor& cache_slot, const at::Tensor& cache_indptr,
                                  const at::Tensor& cache_indices, const at::Tensor& indices, int64_t num_nodes,
                                  const char* op) {
  TORCH_CHECK(cache_slot.scalar_type() == at::kInt && cache_slot.dim() == 1 && cache_slot.numel() == num_nodes, op,
              ": cache_slot must be int32 [num_nodes] (", num_nodes, "), got ", cache_slot.scalar_type(), " ",
              cache_slot.sizes());
  TORCH_CHECK(cache_indptr.scalar_type() == at::kLong && cache_indptr.dim() == 1 && cache_indptr.numel() >= 1, op,
              ": cache_indptr must be 1-D int64 [num_cached + 1], got ", cache_indptr.scalar_type(), " ",
              cache_indptr.sizes());
  TORCH_CHECK(cache_indices.scalar_type() == indices.scalar_type(), op, ": cache_indices must have the dtype of "
              "indices (", indices.scalar_type(), "), got ", cache_indices.scalar_type());
  TORCH_CHECK(cache_slot.is_cuda() && cache_indptr.is_cuda() && cache_indices.is_cuda(), op,
              ": the adjacency cache (cache_slot, cache_indptr, cache_indices) must be in device memory");
}

}  // namespace morphpipe
