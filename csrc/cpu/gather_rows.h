// Feature gathering on the CPU: copying rows of a feature matrix by index, for the op
// `morphpipe::gather_rows` (gather_rows.cpp) and for CpuBatcher's batches.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace morphpipe {

// Copies rows `rows[0..count)` of the 2-D contiguous `source` into the rows of `out`. With `stream`, rows of whole
// 64-byte lines go to memory with non-temporal stores: faster into a recycled buffer whose lines are not cached,
// slower into fresh pages (the kernel's zeroing leaves their lines cached, and each must be evicted first).
void gather_rows_into(const at::Tensor& source, const int64_t* rows, int64_t count, at::Tensor& out, bool stream);

}  // namespace morphpipe
