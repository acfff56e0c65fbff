// Argument checks of the fused aggregation ops, one function per op, called first by both its CPU kernel
// (cpu/aggregate.cpp) and its CUDA kernel (cuda/aggregate.cu) so that both refuse a bad argument with the
// same message. The structure's values are checked after these, by each kernel (structure_errors.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "common/accumulate.h"
#include "common/tensor_checks.h"

namespace morphpipe {

// spmm_sum: the structure, x [num_src, F] and the optional factors edge_weight [nnz], src_scale [num_src],
// dst_scale [rows] in the accumulation dtype, and an optional row order.
inline void check_spmm_sum(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& x,
                           const std::optional<at::Tensor>& edge_weight, const std::optional<at::Tensor>& src_scale,
                           const std::optional<at::Tensor>& dst_scale, const std::optional<at::Tensor>& row_order,
                           const char* op) {
  check_structure(indptr, indices, op);
  const auto device = indptr.device();
  const int64_t rows = indptr.numel() - 1;
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [num_src, F], got shape ", x.sizes());
  check_rows(x, x.size(0), device, op, "x");
  const auto acc = accumulate_dtype(x);
  check_optional_factor(edge_weight, indices.numel(), acc, device, op, "edge_weight");
  check_optional_factor(src_scale, x.size(0), acc, device, op, "src_scale");
  check_optional_factor(dst_scale, rows, acc, device, op, "dst_scale");
  check_optional_row_order(row_order, rows, device, op);
}

// spmm_sum_project: spmm_sum's arguments, x float32 or float64 (the projection accumulates in x's dtype) and
// weight [O, F] of x's dtype and device.
inline void check_spmm_sum_project(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& x,
                                   const std::optional<at::Tensor>& edge_weight,
                                   const std::optional<at::Tensor>& src_scale,
                                   const std::optional<at::Tensor>& dst_scale, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& row_order, const char* op) {
  check_spmm_sum(indptr, indices, x, edge_weight, src_scale, dst_scale, row_order, op);
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
              ": x must be float32 or float64, got ", x.scalar_type(), "; project a half-precision aggregate apart");
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1), op, ": weight must be [out, F] with F=", x.size(1),
              " (x's width), got shape ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.device() == x.device(), op,
              ": weight must have x's dtype ", x.scalar_type(), " and device ", x.device(), ", got ",
              weight.scalar_type(), " on ", weight.device());
}

// spmm_sum_scatter: the structure, grad [rows, F], num_src (at least rows with self loops) and the factors.
inline void check_spmm_sum_scatter(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& grad,
                                   const std::optional<at::Tensor>& edge_weight,
                                   const std::optional<at::Tensor>& src_scale,
                                   const std::optional<at::Tensor>& dst_scale, bool self_loop, int64_t num_src,
                                   const char* op) {
  check_structure(indptr, indices, op);
  const auto device = indptr.device();
  const int64_t rows = indptr.numel() - 1;
  TORCH_CHECK(grad.dim() == 2, op, ": grad must be 2-D [rows, F], got shape ", grad.sizes());
  check_rows(grad, rows, device, op, "grad");
  check_num_src(num_src, op);
  TORCH_CHECK(!self_loop || rows <= num_src, op, ": self loops need rows=", rows, " <= num_src=", num_src);
  const auto acc = accumulate_dtype(grad);
  check_optional_factor(edge_weight, indices.numel(), acc, device, op, "edge_weight");
  check_optional_factor(src_scale, num_src, acc, device, op, "src_scale");
  check_optional_factor(dst_scale, rows, acc, device, op, "dst_scale");
}

// spmm_max: the structure, x [num_src, F], an optional edge_weight [nnz] and an optional row order.
inline void check_spmm_max(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& x,
                           const std::optional<at::Tensor>& edge_weight, const std::optional<at::Tensor>& row_order,
                           const char* op) {
  check_structure(indptr, indices, op);
  const auto device = indptr.device();
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [num_src, F], got shape ", x.sizes());
  check_rows(x, x.size(0), device, op, "x");
  check_optional_factor(edge_weight, indices.numel(), accumulate_dtype(x), device, op, "edge_weight");
  check_optional_row_order(row_order, indptr.numel() - 1, device, op);
}

// spmm_max_backward: indices int64 [nnz], grad [rows, F] and x [num_src, F] sharing F, argmax int64 shaped
// like grad, an optional edge_weight [nnz]; all on indices' device.
inline void check_spmm_max_backward(const at::Tensor& indices, const at::Tensor& argmax, const at::Tensor& grad,
                                    const at::Tensor& x, const std::optional<at::Tensor>& edge_weight,
                                    const char* op) {
  TORCH_CHECK(indices.scalar_type() == at::kLong && indices.dim() == 1, op, ": indices must be 1-D int64 [nnz], got ",
              indices.scalar_type(), " ", indices.sizes(), "; convert with .long()");
  const auto device = indices.device();
  check_on(indices, device, op, "indices");
  TORCH_CHECK(grad.dim() == 2 && x.dim() == 2 && grad.size(1) == x.size(1), op,
              ": grad [rows, F] and x [num_src, F] must share F, got shapes ", grad.sizes(), " and ", x.sizes());
  check_rows(grad, grad.size(0), device, op, "grad");
  check_rows(x, x.size(0), device, op, "x");
  check_rows(argmax, grad.size(0), device, op, "argmax");
  TORCH_CHECK(argmax.scalar_type() == at::kLong && argmax.sizes() == grad.sizes(), op,
              ": argmax must be int64 shaped like grad, got ", argmax.scalar_type(), " ", argmax.sizes());
  check_optional_factor(edge_weight, indices.numel(), accumulate_dtype(grad), device, op, "edge_weight");
}

// sddmm: the structure, a [rows, F] and b [num_src, F] sharing F and dtype.
inline void check_sddmm(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& a, const at::Tensor& b,
                        const char* op) {
  check_structure(indptr, indices, op);
  const auto device = indptr.device();
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1) && a.scalar_type() == b.scalar_type(), op,
              ": a [rows, F] and b [num_src, F] must share F and dtype, got ", a.sizes(), " ", a.scalar_type(),
              " and ", b.sizes(), " ", b.scalar_type());
  check_rows(a, indptr.numel() - 1, device, op, "a");
  check_rows(b, b.size(0), device, op, "b");
}

// csr_transpose: the structure and num_src.
inline void check_csr_transpose(const at::Tensor& indptr, const at::Tensor& indices, int64_t num_src, const char* op) {
  check_structure(indptr, indices, op);
  check_num_src(num_src, op);
}

}  // namespace morphpipe
