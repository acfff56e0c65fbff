// Argument checks of relu_mean_backward (cpu/relu_mean.cpp): the transposed structure, the mean's gradient and
// scale, the optional gradient of the destinations' own rows and the ReLU's saved output.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "common/accumulate.h"
#include "common/tensor_checks.h"

namespace morphpipe {

// t_indptr [rows + 1] / t_dst [nnz] (a block's transposed CSC: one row per source), grad [num_dst, F], scale
// [num_dst] in the accumulation dtype, self_grad absent or [self_rows <= rows, F] and out [rows, F] of grad's dtype.
inline void check_relu_mean_backward(const at::Tensor& t_indptr, const at::Tensor& t_dst, const at::Tensor& grad,
                                     const at::Tensor& scale, const std::optional<at::Tensor>& self_grad,
                                     const at::Tensor& out, double p, const char* op) {
  check_structure(t_indptr, t_dst, op);
  const auto device = t_indptr.device();
  const int64_t rows = t_indptr.numel() - 1;
  TORCH_CHECK(grad.dim() == 2, op, ": grad must be 2-D [num_dst, F], got shape ", grad.sizes());
  check_rows(grad, grad.size(0), device, op, "grad");
  TORCH_CHECK(scale.defined(), op, ": scale must be given ([num_dst], the mean's 1 / in-degree)");
  check_optional_factor(scale, grad.size(0), accumulate_dtype(grad), device, op, "scale");
  TORCH_CHECK(out.dim() == 2 && out.size(1) == grad.size(1) && out.scalar_type() == grad.scalar_type(), op,
              ": out must be 2-D [rows, ", grad.size(1), "] of grad's dtype ", grad.scalar_type(), ", got ",
              out.scalar_type(), " ", out.sizes());
  check_rows(out, rows, device, op, "out");
  if (present(self_grad)) {
    TORCH_CHECK(self_grad->dim() == 2 && self_grad->size(1) == grad.size(1) &&
                    self_grad->scalar_type() == grad.scalar_type() && self_grad->size(0) <= rows,
                op, ": self_grad must be 2-D [self_rows <= ", rows, ", ", grad.size(1), "] of grad's dtype ",
                grad.scalar_type(), ", got ", self_grad->scalar_type(), " ", self_grad->sizes());
    check_on(*self_grad, device, op, "self_grad");
  }
  TORCH_CHECK(p >= 0.0 && p < 1.0, op, ": p must be in [0, 1), got ", p);
}

}  // namespace morphpipe
