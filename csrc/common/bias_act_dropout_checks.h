// Argument checks of the fused bias + activation + dropout op and its backward, shared by the CPU kernels
// (cpu/bias_act_dropout.cpp) and the CUDA kernels (cuda/bias_act_dropout.cu).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "common/dropout_mask.h"
#include "common/tensor_checks.h"

namespace morphpipe {

// Parses the activation name; an error names the accepted ones.
inline Activation parse_activation(const std::string& name, const char* op) {
  if (name == "relu") return Activation::kRelu;
  TORCH_CHECK(name == "identity", op, ": activation must be 'relu' or 'identity', got '", name, "'");
  return Activation::kIdentity;
}

// Shapes and dtypes shared by the CPU and CUDA entry points: x 2-D [rows, F], bias [F] of x's dtype, p in [0, 1).
inline void check_bias_act_dropout(const at::Tensor& x, const std::optional<at::Tensor>& bias, double p,
                                   const char* op) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [rows, features], got shape ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), op, ": x must be contiguous; call .contiguous()");
  TORCH_CHECK(p >= 0.0 && p < 1.0, op, ": p must be in [0, 1), got ", p);
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == x.size(1), op, ": bias must be 1-D [", x.size(1),
                "] (x's feature count), got shape ", bias->sizes());
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->device() == x.device(), op,
                ": bias must have x's dtype and device (", x.scalar_type(), ", ", x.device(), "), got ",
                bias->scalar_type(), ", ", bias->device());
  }
}

// The backward's arguments: grad and out 2-D with one shape and dtype, p in [0, 1), and the bit mask (int32
// [mask_words(n)]) where the backward reads it, i.e. without ReLU and with p > 0; all contiguous on out's
// device. Returns whether the backward reads the mask.
inline bool check_bias_act_dropout_backward(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& mask,
                                            Activation activation, double p, const char* op) {
  TORCH_CHECK(grad.sizes() == out.sizes() && grad.scalar_type() == out.scalar_type() && out.dim() == 2, op,
              ": grad and out must be 2-D with one shape and dtype, got ", grad.sizes(), " ", grad.scalar_type(),
              " and ", out.sizes(), " ", out.scalar_type());
  check_on(out, out.device(), op, "out");
  check_on(grad, out.device(), op, "grad");
  TORCH_CHECK(p >= 0.0 && p < 1.0, op, ": p must be in [0, 1), got ", p);
  const bool use_mask = activation == Activation::kIdentity && p > 0.0;
  if (use_mask) {
    const int64_t words = mask_words(out.numel());
    TORCH_CHECK(mask.dim() == 1 && mask.numel() == words && mask.scalar_type() == at::kInt, op,
                ": mask must be 1-D int32 [", words, "], got ", mask.scalar_type(), " ", mask.sizes());
    check_on(mask, out.device(), op, "mask");
  }
  return use_mask;
}

}  // namespace morphpipe
