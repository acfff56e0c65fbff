// Feature gathering on the CPU: copying rows of a feature matrix by index, for the op
// `morphpipe::gather_rows` (gather_rows.cpp) and for CpuBatcher's batches.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace morphpipe {

// Copies rows `rows[0..count)` of the 2-D contiguous `source` into the rows of `out`.
void gather_rows_into(const at::Tensor& source, const int64_t* rows, int64_t count, at::Tensor& out);

}  // namespace morphpipe
