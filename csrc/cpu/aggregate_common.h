// Shared by the fused CPU aggregation and attention kernels: the scans of a structure's values (every
// index is validated once per call, before any kernel dereferences it; the argument checks come first,
// from common/), the OpenMP destination loop with dynamic scheduling and the accumulation helpers.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/accumulate.h"
#include "common/structure_errors.h"
#include "common/tensor_checks.h"
#include "cpu/vector_convert.h"

namespace morphpipe {

// Features handled per pass over a destination's edges: the accumulator tile stays in L1.
constexpr int64_t kFeatureTile = 256;
// Destinations per dynamic-scheduling chunk: small enough to balance skewed degrees.
constexpr int64_t kRowChunk = 16;
// Rows aggregated, then projected together by spmm_sum_project (each load of the weight serves them all), and
// the output columns each pass accumulates (one AVX-512 vector of float): 4 x 16 accumulators stay in registers.
constexpr int64_t kProjectRows = 4;
constexpr int64_t kProjectCols = 16;
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

// The first position p < count with values[p] outside [low, high), or count when there is none (parallel scan).
inline int64_t first_outside(const int64_t* values, int64_t count, int64_t low, int64_t high) {
  int64_t first = count;
#pragma omp parallel for reduction(min : first) schedule(static) if (count > 65536)
  for (int64_t p = 0; p < count; ++p) {
    if (values[p] < low || values[p] >= high) first = std::min(first, p);
  }
  return first;
}

// indices (int64, contiguous, on the CPU) all lie in [0, num_src); else the error the CUDA kernels raise too.
inline void check_index_values(const at::Tensor& indices, int64_t num_src, const char* op,
                               const StructureBounds& bounds) {
  const int64_t* idx = indices.data_ptr<int64_t>();
  const int64_t bad = first_outside(idx, indices.numel(), 0, num_src);
  if (bad < indices.numel()) raise_structure_error(kStatusIndexOutOfRange, bad, idx[bad], op, bounds);
}

// The values of a CSC (or CSR) structure that check_structure accepted: indptr nondecreasing from 0 to nnz,
// indices in [0, num_src). Scans every entry (O(rows + nnz), in parallel) so kernels may dereference freely;
// the first bad entry raises the error the CUDA kernels report for it (structure_errors.h).
inline void check_csr_values(const at::Tensor& indptr, const at::Tensor& indices, int64_t num_src, const char* op) {
  const int64_t rows = indptr.numel() - 1, nnz = indices.numel();
  const StructureBounds bounds{rows, nnz, num_src};
  const int64_t* ptr = indptr.data_ptr<int64_t>();
  if (ptr[0] != 0) raise_structure_error(kStatusIndptrInvalid, 0, 0, op, bounds);
  int64_t decreasing = rows;  // the first row whose end lies before its start
#pragma omp parallel for reduction(min : decreasing) schedule(static) if (rows > 65536)
  for (int64_t i = 0; i < rows; ++i) {
    if (ptr[i + 1] < ptr[i]) decreasing = std::min(decreasing, i);
  }
  if (decreasing < rows) raise_structure_error(kStatusIndptrInvalid, decreasing, 1, op, bounds);
  if (ptr[rows] != nnz) raise_structure_error(kStatusIndptrInvalid, rows - 1, 1, op, bounds);
  check_index_values(indices, num_src, op, bounds);
}

// Edge ids (argmax entries, transposed edge ids) all lie in [low, nnz), low being -1 where -1 means none.
inline void check_edge_ids(const at::Tensor& ids, int64_t low, const char* op, const StructureBounds& bounds) {
  const int64_t* data = ids.data_ptr<int64_t>();
  const int64_t bad = first_outside(data, ids.numel(), low, bounds.nnz);
  if (bad < ids.numel()) raise_structure_error(kStatusEdgeOutOfRange, bad, data[bad], op, bounds);
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

// Data pointer of an optional row order that check_optional_row_order accepted, checked to be a permutation
// of [0, rows); nullptr when absent.
inline const int64_t* optional_row_order(const std::optional<at::Tensor>& order, int64_t rows, const char* op) {
  if (!present(order)) return nullptr;
  const int64_t* o = order->data_ptr<int64_t>();
  std::vector<char> seen(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    if (o[r] < 0 || o[r] >= rows || seen[o[r]]) {
      raise_structure_error(kStatusRowOrderOutOfRange, r, o[r], op, {rows, 0, 0});
    }
    seen[o[r]] = 1;
  }
  return o;
}

// buf[f] += coef * x[f] for f < n, in the accumulation type (vectorised for float, double and bfloat16).
template <typename scalar_t, typename acc_t>
inline void axpy(acc_t* __restrict__ buf, const scalar_t* __restrict__ x, acc_t coef, int64_t n) {
#pragma omp simd
  for (int64_t f = 0; f < n; ++f) buf[f] += coef * widen<acc_t>(x[f]);
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
