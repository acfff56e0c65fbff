// Argument checks of heterogeneous (typed) neighbour sampling, shared by the CPU typed sampler
// (cpu/hetero_sampler.cpp, behind HeteroCpuBatcher) and any device's typed sampler, so that both refuse a
// bad argument with the same message. Neighbour ranges and ids are checked as the samplers read them.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace morphpipe {

// The typed topology: type_offsets [num_types + 1] starting at 0, non-decreasing; per relation a source and a
// destination type in [0, num_types), indptr int64 [count of destination type + 1] with indptr[-1] == nnz, and
// indices int32 or int64 (source-type local ids), contiguous.
inline void check_typed_topology(const std::vector<int64_t>& type_offsets, const std::vector<int64_t>& src_types,
                                 const std::vector<int64_t>& dst_types, const std::vector<at::Tensor>& indptrs,
                                 const std::vector<at::Tensor>& indices) {
  TORCH_CHECK(type_offsets.size() >= 2 && type_offsets[0] == 0,
              "typed topology: type_offsets must start at 0 and hold num_types + 1 entries");
  for (size_t t = 1; t < type_offsets.size(); ++t) {
    TORCH_CHECK(type_offsets[t] >= type_offsets[t - 1], "typed topology: node type ", t - 1, " has range [",
                type_offsets[t - 1], ", ", type_offsets[t], "); the type ranges must follow one another in order");
  }
  const int64_t num_types = static_cast<int64_t>(type_offsets.size()) - 1;
  const size_t num_relations = src_types.size();
  TORCH_CHECK(dst_types.size() == num_relations && indptrs.size() == num_relations && indices.size() == num_relations,
              "typed topology: src_types, dst_types, indptrs and indices need one entry per relation");
  for (size_t r = 0; r < num_relations; ++r) {
    TORCH_CHECK(src_types[r] >= 0 && src_types[r] < num_types && dst_types[r] >= 0 && dst_types[r] < num_types,
                "typed topology: relation ", r, " joins node types ", src_types[r], " -> ", dst_types[r],
                ", outside [0, ", num_types, ")");
    const at::Tensor& indptr = indptrs[r];
    const at::Tensor& index = indices[r];
    const int64_t num_dst = type_offsets[dst_types[r] + 1] - type_offsets[dst_types[r]];
    TORCH_CHECK(indptr.device().is_cpu() && index.device().is_cpu(), "typed topology: relation ", r,
                " must be in CPU tensors for the CPU sampler");
    TORCH_CHECK(indptr.scalar_type() == at::kLong && indptr.dim() == 1 && indptr.numel() == num_dst + 1,
                "typed topology: relation ", r, "'s indptr must be int64 [", num_dst + 1,
                "] (destination type's node count + 1), got ", indptr.scalar_type(), " ", indptr.sizes());
    TORCH_CHECK((index.scalar_type() == at::kInt || index.scalar_type() == at::kLong) && index.dim() == 1,
                "typed topology: relation ", r, "'s indices must be 1-D int32 or int64, got ", index.scalar_type());
    TORCH_CHECK(indptr.is_contiguous() && index.is_contiguous(), "typed topology: relation ", r,
                "'s indptr and indices must be contiguous; call .contiguous()");
    TORCH_CHECK(indptr.data_ptr<int64_t>()[num_dst] == index.numel(), "typed topology: relation ", r,
                "'s indptr ends at ", indptr.data_ptr<int64_t>()[num_dst], " but its indices hold ", index.numel(),
                " entries; rebuild its CSC");
  }
}

// fanouts[hop][relation]: at least one hop, one count per relation at every hop, each -1 (all), 0 (none) or positive.
inline void check_typed_fanouts(const std::vector<std::vector<int64_t>>& fanouts, size_t num_relations) {
  TORCH_CHECK(!fanouts.empty(), "fanouts: need at least one hop");
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    TORCH_CHECK(fanouts[hop].size() == num_relations, "fanouts[", hop, "] has ", fanouts[hop].size(),
                " relation fanouts, the graph has ", num_relations, " relations; give one per relation");
    for (size_t r = 0; r < num_relations; ++r) {
      TORCH_CHECK(fanouts[hop][r] >= -1, "fanouts[", hop, "][", r, "] = ", fanouts[hop][r],
                  ": a relation's fanout is a neighbour count >= 0, or -1 for all neighbours");
    }
  }
}

}  // namespace morphpipe
