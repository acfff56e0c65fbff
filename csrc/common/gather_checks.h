// Argument checks of feature gathering (gather_rows, out[i] = source[index[i]]), shared by its CPU kernel
// (cpu/gather_rows.cpp) and its CUDA kernel (cuda/gather_rows.cu, which also serves gather_rows_cached)
// so that both refuse a bad argument or a bad index with the same message.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace morphpipe {

// source 2-D [rows, width], index 1-D int64.
inline void check_gather_rows(const at::Tensor& source, const at::Tensor& index, const char* op) {
  TORCH_CHECK(source.dim() == 2, op, ": source must be a 2-D [rows, width] tensor, got shape ", source.sizes());
  TORCH_CHECK(index.dim() == 1 && index.scalar_type() == at::kLong, op, ": index must be a 1-D int64 tensor, got ",
              index.scalar_type(), " of shape ", index.sizes(), "; convert with .long()");
}

// index[position] = value names a row of source, which has num_rows rows.
inline void check_gathered_row(int64_t position, int64_t value, int64_t num_rows, const char* op) {
  TORCH_CHECK(value >= 0 && value < num_rows, op, ": index[", position, "] = ", value, " is outside [0, ", num_rows,
              ")");
}

// gather_rows_cached's device cache (when cache_slot is not empty): cache_slot int32 [rows of source] and
// cache_rows [num_cached, width] of source's dtype, both in device memory.
inline void check_row_cache(const at::Tensor& cache_slot, const at::Tensor& cache_rows, const at::Tensor& source,
                            const char* op) {
  TORCH_CHECK(cache_slot.scalar_type() == at::kInt && cache_slot.dim() == 1 && cache_slot.numel() == source.size(0),
              op, ": cache_slot must be int32 [rows of source] (", source.size(0), "), got ", cache_slot.scalar_type(),
              " ", cache_slot.sizes());
  TORCH_CHECK(cache_rows.is_cuda() && cache_rows.dim() == 2 && cache_rows.size(1) == source.size(1) &&
                  cache_rows.scalar_type() == source.scalar_type(),
              op, ": cache_rows must be a CUDA tensor [num_cached, ", source.size(1), "] of ", source.scalar_type(),
              ", got ", cache_rows.scalar_type(), " ", cache_rows.sizes(), " on ", cache_rows.device());
  TORCH_CHECK(cache_slot.is_cuda(), op, ": cache_slot must be in device memory, got ", cache_slot.device());
}

}  // namespace morphpipe
