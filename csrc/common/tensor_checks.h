// The argument checks every op's check header is built from, for CPU and CUDA tensors alike: `device` is
// the op's device (that of its structure or main input), and every message names the op, the argument
// and the fix.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace morphpipe {

// `t` sits on `device` with the op's other tensors and is contiguous.
inline void check_on(const at::Tensor& t, const at::Device& device, const char* op, const char* name) {
  TORCH_CHECK(t.device() == device, op, ": ", name, " must be on ", device, " with the op's other tensors, got ",
              t.device());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous; call .contiguous()");
}

// `t` sits on `device`, is contiguous and has `rows` rows.
inline void check_rows(const at::Tensor& t, int64_t rows, const at::Device& device, const char* op,
                       const char* name) {
  check_on(t, device, op, name);
  TORCH_CHECK(t.dim() >= 1 && t.size(0) == rows, op, ": ", name, " must have ", rows, " rows, got shape ",
              t.sizes());
}

// A CSC (or CSR) structure's tensors: int64 indptr [rows + 1] and indices [nnz], contiguous, on one device.
// Their values (indptr nondecreasing from 0 to nnz, indices in range) are each kernel's to check.
inline void check_structure(const at::Tensor& indptr, const at::Tensor& indices, const char* op) {
  TORCH_CHECK(indptr.scalar_type() == at::kLong && indices.scalar_type() == at::kLong, op,
              ": indptr and indices must be int64, got ", indptr.scalar_type(), " and ", indices.scalar_type(),
              "; convert with .long()");
  TORCH_CHECK(indptr.dim() == 1 && indptr.numel() >= 1 && indices.dim() == 1, op,
              ": indptr must be 1-D [rows + 1] and indices 1-D [nnz], got shapes ", indptr.sizes(), " and ",
              indices.sizes());
  check_on(indptr, indptr.device(), op, "indptr");
  check_on(indices, indptr.device(), op, "indices");
  TORCH_CHECK(indptr.numel() > 1 || indices.numel() == 0, op, ": indptr must run from 0 to nnz=", indices.numel(),
              ", but it has no rows; rebuild the block");
}

// A count of source rows: >= 0.
inline void check_num_src(int64_t num_src, const char* op) {
  TORCH_CHECK(num_src >= 0, op, ": num_src must be >= 0, got ", num_src);
}

// Whether an optional tensor argument was given.
inline bool present(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// An optional per-row (or per-edge) factor: absent, or 1-D [rows] of the accumulation dtype `acc` on `device`.
inline void check_optional_factor(const std::optional<at::Tensor>& t, int64_t rows, at::ScalarType acc,
                                  const at::Device& device, const char* op, const char* name) {
  if (!present(t)) return;
  check_rows(*t, rows, device, op, name);
  TORCH_CHECK(t->dim() == 1, op, ": ", name, " must be 1-D, got shape ", t->sizes());
  TORCH_CHECK(t->scalar_type() == acc, op, ": ", name, " must be ", acc, " (the accumulation dtype), got ",
              t->scalar_type());
}

// An optional row order: absent, or 1-D int64 [rows] on `device`. That it is a permutation of [0, rows) is
// each kernel's to check (the CPU before it runs, the CUDA kernels entry by entry).
inline void check_optional_row_order(const std::optional<at::Tensor>& order, int64_t rows, const at::Device& device,
                                     const char* op) {
  if (!present(order)) return;
  check_rows(*order, rows, device, op, "row_order");
  TORCH_CHECK(order->dim() == 1 && order->scalar_type() == at::kLong, op, ": row_order must be 1-D int64, got ",
              order->scalar_type(), " ", order->sizes());
}

// Data pointer of an optional argument the checks above accepted; nullptr when absent.
template <typename T>
const T* optional_data(const std::optional<at::Tensor>& t) {
  return present(t) ? t->data_ptr<T>() : nullptr;
}

}  // namespace morphpipe
