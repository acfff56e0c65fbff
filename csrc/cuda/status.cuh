// A small device record of the first bad input a kernel met (kind, position, value), through which
// kernels report bad indices instead of reading them. Unlike CUDA_KERNEL_ASSERT, which c10 compiles
// into release builds too and which leaves the CUDA context unusable after it fires, a report is
// read back by the host op and raised as an ordinary error, in the words the CPU ops use
// (common/structure_errors.h, which also lists the kinds of report).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "common/structure_errors.h"

namespace morphpipe::cuda {

// Records the first report; later ones are dropped. `status` may be nullptr (unchecked calls).
__device__ __forceinline__ void report(int64_t* status, int64_t kind, int64_t position, int64_t value) {
  if (status == nullptr) return;
  if (atomicCAS(reinterpret_cast<unsigned long long*>(status), 0ULL, static_cast<unsigned long long>(kind)) == 0ULL) {
    status[1] = position;
    status[2] = value;
  }
}

// A zeroed status record on `device` (int64 [3]).
inline at::Tensor new_status(const at::Device& device) {
  return at::zeros({3}, at::TensorOptions().dtype(at::kLong).device(device));
}

// Reads `status` back (one device sync) and throws what a kernel recorded in it.
inline void check_structure_status(const at::Tensor& status, const char* op, const StructureBounds& bounds) {
  const at::Tensor host = status.cpu();
  const int64_t* reported = host.data_ptr<int64_t>();
  raise_structure_error(reported[0], reported[1], reported[2], op, bounds);
}

}  // namespace morphpipe::cuda
