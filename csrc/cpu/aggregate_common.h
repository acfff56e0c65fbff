// Shared by the fused CPU aggregation and attention kernels: accumulation types, argument checks
// (every index is validated once per call, before any kernel dereferences it) and the OpenMP
// destination loop with dynamic scheduling.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace morphpipe {

// Sums of half-precision values are taken in float, as the CUDA kernels do in registers.
template <typename T>
struct Accumulate {
  using type = T;
};
template <>
struct Accumulate<at::Half> {
  using type = float;
};
template <>
struct Accumulate<at::BFloat16> {
  using type = float;
};
template <typename T>
using acc_type = typename Accumulate<T>::type;

// Features handled per pass over a destination's edges: the accumulator tile stays in L1.
constexpr int64_t kFeatureTile = 256;
// Destinations per dynamic-scheduling chunk: small enough to balance skewed degrees.
constexpr int64_t kRowChunk = 16;
// Edges ahead whose source rows are prefetched: gathers from large feature matrices are bound by
// DRAM latency, and the next rows' addresses are known from the indices.
constexpr int64_t kPrefetchEdges = 16;

// Asks for the cache lines of `n` values at `p` (a neighbour's feature row) ahead of use.
template <typename scalar_t>
inline void prefetch_row(const scalar_t* p, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(p);
  const int64_t size = n * static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t b = 0; b < size; b += 64) __builtin_prefetch(bytes + b, 0, 3);
}

// The accumulation dtype for `x`: float for half types, x's own dtype otherwise.
inline at::ScalarType accumulate_dtype(const at::Tensor& x) {
  const auto dtype = x.scalar_type();
  return (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
}

// A CSC (or CSR) structure: int64 indptr [rows + 1] from 0 to nnz, nondecreasing, int64 indices in
// [0, num_src). Scans every entry (O(rows + nnz), in parallel) so kernels may dereference freely.
inline void check_csr(const at::Tensor& indptr, const at::Tensor& indices, int64_t num_src, const char* op) {
  TORCH_CHECK(indptr.device().is_cpu() && indices.device().is_cpu(), op,
              ": indptr and indices must be CPU tensors for the CPU kernel");
  TORCH_CHECK(indptr.scalar_type() == at::kLong && indices.scalar_type() == at::kLong, op,
              ": indptr and indices must be int64, got ", indptr.scalar_type(), " and ", indices.scalar_type(),
              "; convert with .long()");
  TORCH_CHECK(indptr.dim() == 1 && indptr.numel() >= 1 && indices.dim() == 1, op,
              ": indptr must be 1-D [rows + 1] and indices 1-D [nnz], got shapes ", indptr.sizes(), " and ",
              indices.sizes());
  TORCH_CHECK(indptr.is_contiguous() && indices.is_contiguous(), op,
              ": indptr and indices must be contiguous; call .contiguous()");
  TORCH_CHECK(num_src >= 0, op, ": num_src must be >= 0, got ", num_src);
  const int64_t rows = indptr.numel() - 1;
  const int64_t nnz = indices.numel();
  const int64_t* ptr = indptr.data_ptr<int64_t>();
  const int64_t* idx = indices.data_ptr<int64_t>();
  TORCH_CHECK(ptr[0] == 0 && ptr[rows] == nnz, op, ": indptr must run from 0 to nnz=", nnz, ", got indptr[0]=",
              ptr[0], " and indptr[-1]=", ptr[rows], "; rebuild the block");
  int64_t decreasing = 0;
  int64_t out_of_range = 0;
#pragma omp parallel for reduction(+ : decreasing) schedule(static) if (rows > 65536)
  for (int64_t i = 0; i < rows; ++i) decreasing += ptr[i + 1] < ptr[i];
  TORCH_CHECK(decreasing == 0, op, ": indptr decreases at ", decreasing, " places; it must be nondecreasing");
#pragma omp parallel for reduction(+ : out_of_range) schedule(static) if (nnz > 65536)
  for (int64_t e = 0; e < nnz; ++e) out_of_range += static_cast<uint64_t>(idx[e]) >= static_cast<uint64_t>(num_src);
  TORCH_CHECK(out_of_range == 0, op, ": ", out_of_range, " indices are outside [0, num_src=", num_src,
              "); every index must be a local source id");
}

// `t` is a contiguous CPU tensor whose first dim is `rows`.
inline void check_rows(const at::Tensor& t, int64_t rows, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor for the CPU kernel, got ", t.device());
  TORCH_CHECK(t.dim() >= 1 && t.size(0) == rows, op, ": ", name, " must have ", rows, " rows, got shape ",
              t.sizes());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous; call .contiguous()");
}

// Data pointer of an optional per-row (or per-edge) factor of the accumulation dtype, nullptr when absent.
template <typename acc_t>
const acc_t* optional_factor(const std::optional<at::Tensor>& t, int64_t rows, at::ScalarType acc, const char* op,
                             const char* name) {
  if (!t.has_value() || !t->defined()) return nullptr;
  check_rows(*t, rows, op, name);
  TORCH_CHECK(t->dim() == 1, op, ": ", name, " must be 1-D, got shape ", t->sizes());
  TORCH_CHECK(t->scalar_type() == acc, op, ": ", name, " must be ", acc, " (the accumulation dtype), got ",
              t->scalar_type());
  return t->data_ptr<acc_t>();
}

// Runs `body(row)` for every row with OpenMP dynamic scheduling; serial when the work is tiny.
// With `order` (a permutation of the rows, e.g. heaviest first) rows are taken in that order.
template <typename Body>
void for_each_row(int64_t rows, int64_t work, const Body& body, const int64_t* order = nullptr) {
  const int threads = at::get_num_threads();
  const bool parallel = threads > 1 && work > 32768 && rows > 1;
#pragma omp parallel for schedule(dynamic, kRowChunk) num_threads(threads) if (parallel)
  for (int64_t r = 0; r < rows; ++r) body(order ? order[r] : r);
}

// Data pointer of an optional row order, checked to be a permutation of [0, rows); nullptr when absent.
inline const int64_t* optional_row_order(const std::optional<at::Tensor>& order, int64_t rows, const char* op) {
  if (!order.has_value() || !order->defined()) return nullptr;
  check_rows(*order, rows, op, "row_order");
  TORCH_CHECK(order->dim() == 1 && order->scalar_type() == at::kLong, op, ": row_order must be 1-D int64, got ",
              order->scalar_type(), " ", order->sizes());
  const int64_t* o = order->data_ptr<int64_t>();
  std::vector<char> seen(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(o[r] >= 0 && o[r] < rows && !seen[o[r]], op, ": row_order must be a permutation of [0, ", rows,
                "), entry ", r, " is ", o[r]);
    seen[o[r]] = 1;
  }
  return o;
}

// buf[f] += coef * x[f] for f < n, in the accumulation type (vectorised for float/double).
template <typename scalar_t, typename acc_t>
inline void axpy(acc_t* __restrict__ buf, const scalar_t* __restrict__ x, acc_t coef, int64_t n) {
#pragma omp simd
  for (int64_t f = 0; f < n; ++f) buf[f] += coef * static_cast<acc_t>(x[f]);
}

// Atomic buf[f] += coef * x[f] (other threads may add to the same row).
template <typename scalar_t, typename acc_t>
inline void atomic_axpy(acc_t* buf, const scalar_t* __restrict__ x, acc_t coef, int64_t n) {
  for (int64_t f = 0; f < n; ++f) {
    const acc_t v = coef * static_cast<acc_t>(x[f]);
#pragma omp atomic
    buf[f] += v;
  }
}

}  // namespace morphpipe
