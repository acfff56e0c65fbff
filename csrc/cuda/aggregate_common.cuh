// Shared by the fused CUDA aggregation and attention kernels (Seastar's recipe): one thread group
// per destination (vertex-parallel, edge-sequential, partial sums in registers), the group being
// 2^k threads for the largest 2^k <= feature width (at most a warp), several groups per block.
// Index safety: host code checks shapes, dtypes and devices with the CPU ops' checks (common/*_checks.h);
// kernels bounds-check every index they read before using it, skip a bad one and report it through a
// status record (status.cuh), which the host op reads back after the launch (one sync per op) and
// raises as the CPU ops do.
// No CUDA_KERNEL_ASSERT: it stays in release builds and leaves the CUDA context unusable.
// Only c10's CUDA headers are used (not ATen/cuda/CUDAContext.h), so a toolkit with just nvcc
// and the runtime headers builds them.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/accumulate.h"
#include "cuda/status.cuh"

namespace morphpipe::cuda {

constexpr int kThreadsPerBlock = 256;
constexpr int kWarp = 32;

// The stream kernels launch on: the current one of the current device.
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Threads per destination: the largest power of two <= width, at most a warp (Seastar's feature-adaptive groups).
inline int group_size(int64_t width) {
  int group = 1;
  while (group * 2 <= width && group < kWarp) group *= 2;
  return group;
}

// Blocks for `rows` groups of `group` threads.
inline unsigned blocks_for(int64_t rows, int group) {
  const int64_t threads = std::max<int64_t>(rows, 1) * group;
  return static_cast<unsigned>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

// The destination a group works on and its edge range [begin, end); false for idle groups and bad
// row_order entries. A bad indptr entry (as the CPU check: indptr[0] == 0, nondecreasing, indptr[rows]
// == nnz) is reported and its row treated as empty.
__device__ __forceinline__ bool group_row(int64_t group, int64_t rows, const int64_t* order, const int64_t* indptr,
                                          int64_t nnz, int64_t* status, int64_t& row, int64_t& begin, int64_t& end) {
  if (group >= rows) return false;
  row = order ? order[group] : group;
  if (row < 0 || row >= rows) {
    report(status, kStatusRowOrderOutOfRange, group, row);
    return false;
  }
  begin = indptr[row];
  end = indptr[row + 1];
  const bool bad_begin = begin < 0 || begin > nnz || (row == 0 && begin != 0);
  const bool bad_end = end < begin || end > nnz || (row == rows - 1 && end != nnz);
  if (bad_begin || bad_end) {
    report(status, kStatusIndptrInvalid, row, bad_begin ? 0 : 1);
    begin = end = 0;
  }
  return true;
}

// group_row for the calling thread's group, groups being G consecutive threads of the launch.
template <int G>
__device__ __forceinline__ bool this_group_row(int64_t rows, const int64_t* order, const int64_t* indptr, int64_t nnz,
                                               int64_t* status, int64_t& row, int64_t& begin, int64_t& end) {
  const int64_t group = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  return group_row(group, rows, order, indptr, nnz, status, row, begin, end);
}

// Whether `index` (found at `position`) is a row of a table with `size` rows; reports it when not (callers skip it).
__device__ __forceinline__ bool valid_index(int64_t index, int64_t size, int64_t* status, int64_t kind,
                                            int64_t position) {
  if (index >= 0 && index < size) return true;
  report(status, kind, position, index);
  return false;
}

// Lanes of the calling thread's group within its warp (for shuffles restricted to the group).
template <int G>
__device__ __forceinline__ unsigned group_mask() {
  if constexpr (G == kWarp) {
    return 0xffffffffu;
  } else {
    const unsigned lane = threadIdx.x % kWarp;
    return ((1u << G) - 1u) << (lane / G * G);
  }
}

template <int G, typename T>
__device__ __forceinline__ T group_sum(T value, unsigned mask) {
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(mask, value, offset, G);
  return value;
}

template <int G, typename T>
__device__ __forceinline__ T group_max(T value, unsigned mask) {
#pragma unroll
  for (int offset = G / 2; offset > 0; offset /= 2) value = max(value, __shfl_xor_sync(mask, value, offset, G));
  return value;
}

// Calls `launch(std::integral_constant<int, G>{})` with the compile-time group size G for `group`.
template <typename Launch>
void with_group_size(int group, const Launch& launch) {
  switch (group) {
    case 32: launch(std::integral_constant<int, 32>{}); break;
    case 16: launch(std::integral_constant<int, 16>{}); break;
    case 8: launch(std::integral_constant<int, 8>{}); break;
    case 4: launch(std::integral_constant<int, 4>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    default: launch(std::integral_constant<int, 1>{}); break;
  }
}

}  // namespace morphpipe::cuda
