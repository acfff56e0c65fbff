// Argument checks of edge-batch sampling (the op sample_edge_batch and the CpuBatcher's edge task), so both
// refuse a bad argument with the same message. Edge ids and drawn node ids are checked as they are read.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

namespace morphpipe {

// The training positives: pair_src and pair_dst int64 [E], contiguous, on the CPU (ids checked as read);
// num_negatives >= 0; negative_cdf empty (uniform corruption) or float64 [num_nodes], non-decreasing with a
// positive last entry (the cumulative corruption weights); the graph's num_nodes fits a packed edge key.
inline void check_edge_task(const at::Tensor& pair_src, const at::Tensor& pair_dst, int64_t num_negatives,
                            const at::Tensor& negative_cdf, int64_t num_nodes) {
  TORCH_CHECK(pair_src.dim() == 1 && pair_dst.dim() == 1 && pair_src.numel() == pair_dst.numel(),
              "edge pairs: pair_src and pair_dst must be 1-D with one entry per edge, got shapes ", pair_src.sizes(),
              " and ", pair_dst.sizes());
  TORCH_CHECK(pair_src.scalar_type() == at::kLong && pair_dst.scalar_type() == at::kLong,
              "edge pairs: pair_src and pair_dst must be int64, got ", pair_src.scalar_type(), " and ",
              pair_dst.scalar_type());
  TORCH_CHECK(pair_src.is_contiguous() && pair_dst.is_contiguous() && pair_src.device().is_cpu() &&
                  pair_dst.device().is_cpu(),
              "edge pairs: pair_src and pair_dst must be contiguous CPU tensors");
  TORCH_CHECK(num_negatives >= 0, "num_negatives: need 0 or more negatives per positive, got ", num_negatives);
  TORCH_CHECK(num_nodes < (int64_t{3} << 30), "edge batches: the graph has ", num_nodes,
              " nodes; edge keys hold at most 3 * 2^30");
  if (negative_cdf.defined() && negative_cdf.numel() > 0) {
    TORCH_CHECK(negative_cdf.dim() == 1 && negative_cdf.scalar_type() == at::kDouble &&
                    negative_cdf.numel() == num_nodes && negative_cdf.is_contiguous() && negative_cdf.device().is_cpu(),
                "negative_cdf: expected a contiguous float64 CPU tensor of ", num_nodes,
                " cumulative weights (one per node), got ", negative_cdf.scalar_type(), " ", negative_cdf.sizes());
    const double last = negative_cdf.data_ptr<double>()[num_nodes - 1];
    TORCH_CHECK(last > 0 && std::isfinite(last), "negative_cdf: the total corruption weight is ", last,
                "; it must be positive and finite (a graph without edges has no degree-biased negatives)");
  }
}

// Edge id `position` of a batch, `value`, names a training positive in [0, num_pairs).
inline void check_edge_id(int64_t position, int64_t value, int64_t num_pairs) {
  TORCH_CHECK(value >= 0 && value < num_pairs, "edge_ids[", position, "] = ", value,
              " is not a training edge id in [0, ", num_pairs, "); pass ids of the edge split's training pairs");
}

// A node id `value` read from `what` at `position` lies in [0, num_nodes).
inline void check_pair_node(const char* what, int64_t position, int64_t value, int64_t num_nodes) {
  TORCH_CHECK(value >= 0 && value < num_nodes, what, "[", position, "] = ", value, " is not a node id in [0, ",
              num_nodes, "); validate the edge split (EdgeSplit.validate)");
}

}  // namespace morphpipe
