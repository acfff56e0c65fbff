// Argument checks of the fused pair scorer (pair_dot, out[i] = <h[src[i]], h[dst[i]]>) and its backward, shared by
// the CPU kernels (cpu/pair_score.cpp) and any other device's, so that all refuse a bad argument with one message.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "common/tensor_checks.h"

namespace morphpipe {

// h 2-D [rows, width] contiguous; src and dst 1-D int64 of one length on h's device. Values are checked by
// check_pair_index as the kernel reads them.
inline void check_pair_dot(const at::Tensor& h, const at::Tensor& src, const at::Tensor& dst, const char* op) {
  TORCH_CHECK(h.dim() == 2, op, ": h must be a 2-D [rows, width] tensor of embeddings, got shape ", h.sizes());
  check_on(h, h.device(), op, "h");
  TORCH_CHECK(src.dim() == 1 && dst.dim() == 1 && src.scalar_type() == at::kLong && dst.scalar_type() == at::kLong,
              op, ": src and dst must be 1-D int64 tensors, got ", src.scalar_type(), " ", src.sizes(), " and ",
              dst.scalar_type(), " ", dst.sizes(), "; convert with .long()");
  TORCH_CHECK(src.numel() == dst.numel(), op, ": src and dst must list one pair each per position, got ",
              src.numel(), " and ", dst.numel(), " entries");
  check_on(src, h.device(), op, "src");
  check_on(dst, h.device(), op, "dst");
}

// The backward's arguments: pair_dot's, and grad 1-D [pairs] of h's dtype on h's device.
inline void check_pair_dot_backward(const at::Tensor& h, const at::Tensor& src, const at::Tensor& dst,
                                    const at::Tensor& grad, const char* op) {
  check_pair_dot(h, src, dst, op);
  TORCH_CHECK(grad.dim() == 1 && grad.numel() == src.numel() && grad.scalar_type() == h.scalar_type(), op,
              ": grad must be 1-D [", src.numel(), "] (one per pair) of h's dtype ", h.scalar_type(), ", got ",
              grad.scalar_type(), " ", grad.sizes());
  check_on(grad, h.device(), op, "grad");
}

// name[position] = value names a row of h, which has num_rows rows.
inline void check_pair_index(const char* name, int64_t position, int64_t value, int64_t num_rows, const char* op) {
  TORCH_CHECK(value >= 0 && value < num_rows, op, ": ", name, "[", position, "] = ", value,
              " is outside [0, ", num_rows, ") (the rows of h)");
}

}  // namespace morphpipe
