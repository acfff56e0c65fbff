// Argument checks of the fused GAT ops, one function per op, called first by both its CPU kernel
// (cpu/gat.cpp) and its CUDA kernel (cuda/gat.cu) so that both refuse a bad argument with the same
// message. The structure's values are checked after these, by each kernel (structure_errors.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "common/accumulate.h"
#include "common/tensor_checks.h"

namespace morphpipe {

// Sizes of one GAT call: h_heads is heads, or 1 when every head shares the features.
struct GatShape {
  int64_t num_src, num_dst, heads, h_heads, F, nnz;
};

// What gat_forward and gat_backward share: the structure, h [num_src, heads or 1, F], score_src [num_src, heads]
// and score_dst [num_dst, heads] in h's accumulation dtype, self loops only with num_dst <= num_src, a row order.
inline GatShape check_gat(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& h,
                          const at::Tensor& score_src, const at::Tensor& score_dst, bool self_loop,
                          const std::optional<at::Tensor>& row_order, const char* op) {
  check_structure(indptr, indices, op);
  const auto device = indptr.device();
  TORCH_CHECK(h.dim() == 3, op, ": h must be [num_src, heads or 1, F], got shape ", h.sizes());
  check_rows(h, h.size(0), device, op, "h");
  const int64_t num_src = h.size(0), num_dst = indptr.numel() - 1;
  TORCH_CHECK(score_src.dim() == 2 && score_dst.dim() == 2 && score_src.size(1) == score_dst.size(1), op,
              ": score_src [num_src, heads] and score_dst [num_dst, heads] must share heads, got ", score_src.sizes(),
              " and ", score_dst.sizes());
  check_rows(score_src, num_src, device, op, "score_src");
  check_rows(score_dst, num_dst, device, op, "score_dst");
  const auto acc = accumulate_dtype(h);
  TORCH_CHECK(score_src.scalar_type() == acc && score_dst.scalar_type() == acc, op, ": scores must be ", acc,
              " (the accumulation dtype of h), got ", score_src.scalar_type(), " and ", score_dst.scalar_type());
  const int64_t heads = score_src.size(1);
  TORCH_CHECK(h.size(1) == heads || h.size(1) == 1, op, ": h has ", h.size(1), " heads but the scores ", heads,
              "; use heads or 1 (shared)");
  TORCH_CHECK(!self_loop || num_dst <= num_src, op, ": self loops need num_dst=", num_dst, " <= num_src=", num_src,
              " (prefix convention)");
  check_optional_row_order(row_order, num_dst, device, op);
  return {num_src, num_dst, heads, h.size(1), h.size(2), indices.numel()};
}

// gat_backward: check_gat's arguments, the forward's row_max and row_sum, and grad_out [num_dst, heads, F].
inline GatShape check_gat_backward(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& h,
                                   const at::Tensor& score_src, const at::Tensor& score_dst, const at::Tensor& row_max,
                                   const at::Tensor& row_sum, const at::Tensor& grad_out, bool self_loop,
                                   const std::optional<at::Tensor>& row_order, const char* op) {
  const GatShape s = check_gat(indptr, indices, h, score_src, score_dst, self_loop, row_order, op);
  const auto device = indptr.device();
  const auto acc = accumulate_dtype(h);
  for (const auto& [t, name] : {std::pair{row_max, "row_max"}, std::pair{row_sum, "row_sum"}}) {
    check_rows(t, s.num_dst, device, op, name);
    TORCH_CHECK(t.scalar_type() == acc && t.sizes() == score_dst.sizes(), op, ": ", name,
                " must be the gat_forward statistic (", acc, ", shape ", score_dst.sizes(), "), got ", t.scalar_type(),
                " ", t.sizes());
  }
  check_rows(grad_out, s.num_dst, device, op, "grad_out");
  TORCH_CHECK(grad_out.dim() == 3 && grad_out.size(1) == s.heads && grad_out.size(2) == s.F &&
                  grad_out.scalar_type() == h.scalar_type(),
              op, ": grad_out must be [num_dst, heads, F] of h's dtype, got ", grad_out.sizes(), " ",
              grad_out.scalar_type());
  return s;
}

// What gat_grad_h and gat_grad_h_scatter share: grad_out [num_dst, heads, F], alpha [nnz, heads] and alpha_self
// ([num_dst, heads], or empty without self loops) in its accumulation dtype, h_heads heads or 1; on `device`.
inline void check_attention_gradients(const at::Tensor& alpha, const at::Tensor& alpha_self, const at::Tensor& grad_out,
                                      int64_t nnz, int64_t h_heads, const at::Device& device, const char* op) {
  TORCH_CHECK(grad_out.dim() == 3, op, ": grad_out must be [num_dst, heads, F], got shape ", grad_out.sizes());
  check_rows(grad_out, grad_out.size(0), device, op, "grad_out");
  const int64_t heads = grad_out.size(1);
  const auto acc = accumulate_dtype(grad_out);
  check_rows(alpha, nnz, device, op, "alpha");
  TORCH_CHECK(alpha.dim() == 2 && alpha.size(1) == heads && alpha.scalar_type() == acc, op, ": alpha must be [nnz, ",
              heads, "] of ", acc, ", got ", alpha.sizes(), " ", alpha.scalar_type());
  if (alpha_self.numel() > 0) {
    check_rows(alpha_self, grad_out.size(0), device, op, "alpha_self");
    TORCH_CHECK(alpha_self.dim() == 2 && alpha_self.size(1) == heads && alpha_self.scalar_type() == acc, op,
                ": alpha_self must be [num_dst, ", heads, "] of ", acc, ", got ", alpha_self.sizes(), " ",
                alpha_self.scalar_type());
  }
  TORCH_CHECK(h_heads == heads || h_heads == 1, op, ": h_heads must be ", heads, " or 1, got ", h_heads);
}

// gat_grad_h: the transposed structure (t_indptr [num_src + 1], t_dst and t_eid [nnz]) and the gradients.
inline void check_gat_grad_h(const at::Tensor& t_indptr, const at::Tensor& t_dst, const at::Tensor& t_eid,
                             const at::Tensor& alpha, const at::Tensor& alpha_self, const at::Tensor& grad_out,
                             int64_t h_heads, const char* op) {
  check_structure(t_indptr, t_dst, op);
  check_structure(t_indptr, t_eid, op);
  TORCH_CHECK(t_dst.numel() == t_eid.numel(), op, ": t_dst and t_eid must both have nnz entries, got ",
              t_dst.numel(), " and ", t_eid.numel());
  check_attention_gradients(alpha, alpha_self, grad_out, t_eid.numel(), h_heads, t_indptr.device(), op);
  const int64_t num_dst = grad_out.size(0), num_src = t_indptr.numel() - 1;
  TORCH_CHECK(alpha_self.numel() == 0 || num_dst <= num_src, op, ": self loops need num_dst=", num_dst,
              " <= num_src=", num_src);
}

// gat_grad_h_scatter: the structure (one row per grad_out row), num_src and the gradients.
inline void check_gat_grad_h_scatter(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& alpha,
                                     const at::Tensor& alpha_self, const at::Tensor& grad_out, int64_t num_src,
                                     int64_t h_heads, const char* op) {
  check_structure(indptr, indices, op);
  check_attention_gradients(alpha, alpha_self, grad_out, indices.numel(), h_heads, indptr.device(), op);
  const int64_t num_dst = grad_out.size(0);
  TORCH_CHECK(indptr.numel() - 1 == num_dst, op, ": indptr has ", indptr.numel() - 1, " rows but grad_out ", num_dst);
  check_num_src(num_src, op);
  TORCH_CHECK(alpha_self.numel() == 0 || num_dst <= num_src, op, ": self loops need num_dst=", num_dst,
              " <= num_src=", num_src);
}

}  // namespace morphpipe
