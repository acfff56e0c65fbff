// The accumulation type of the fused kernels, CPU and CUDA alike: sums of half-precision values run in
// float (in registers on the GPU), others in their own type. Optional per-edge / per-row factors, GAT
// scores and gradients of those come in this dtype.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

namespace morphpipe {

template <typename T>
using acc_type = at::opmath_type<T>;

// The accumulation dtype for `x`: float for half types, x's own dtype otherwise.
inline at::ScalarType accumulate_dtype(const at::Tensor& x) {
  const auto dtype = x.scalar_type();
  return (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
}

}  // namespace morphpipe
