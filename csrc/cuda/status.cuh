// A small device record of the first bad input a kernel met (kind, position, value), through which
// kernels report bad indices instead of reading them. Unlike CUDA_KERNEL_ASSERT, which c10 compiles
// into release builds too and which leaves the CUDA context unusable after it fires, a report is
// read back by the host op and raised as an ordinary error, as the CPU ops raise theirs.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace morphpipe::cuda {

enum StatusKind : int64_t {
  kStatusOk = 0,
  kStatusSeedOutOfRange = 1,       // position: seed slot, value: the id
  kStatusSeedRepeated = 2,         // position: seed slot, value: the id
  kStatusNeighbourOutOfRange = 3,  // position: offset in the list, value: the id
  kStatusIndexOutOfRange = 4,      // position: index slot (edge), value: the index
  kStatusRowOrderOutOfRange = 5,   // position: order slot, value: the row
  kStatusIndptrInvalid = 6,        // position: row, value: 0 for a bad indptr[row], 1 for a bad indptr[row + 1]
  kStatusEdgeOutOfRange = 7,       // position: slot of an edge id (argmax, t_eid), value: the edge id
};

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

// The bounds a structure's entries must respect, for the error text.
struct StructureBounds {
  int64_t rows;     // indptr has rows + 1 entries
  int64_t nnz;      // indptr runs from 0 to nnz; edge ids lie in [0, nnz)
  int64_t num_src;  // indices lie in [0, num_src)
};

// Throws the error an aggregation kernel recorded in the host copy `reported` (kind, position, value),
// in the words of the CPU ops' checks.
inline void raise_structure_status(const int64_t* reported, const char* op, const StructureBounds& bounds) {
  const int64_t kind = reported[0], position = reported[1], value = reported[2];
  TORCH_CHECK(kind != kStatusIndexOutOfRange, op, ": indices[", position, "] = ", value, " is outside [0, num_src=",
              bounds.num_src, "); every index must be a local source id");
  TORCH_CHECK(kind != kStatusRowOrderOutOfRange, op, ": row_order must be a permutation of [0, ", bounds.rows,
              "), entry ", position, " is ", value);
  TORCH_CHECK(kind != kStatusIndptrInvalid, op, ": indptr must be nondecreasing from 0 to nnz=", bounds.nnz,
              "; indptr[", position + value, "] breaks that; rebuild the block");
  TORCH_CHECK(kind != kStatusEdgeOutOfRange, op, ": edge id ", value, " at position ", position,
              " is outside [0, nnz=", bounds.nnz, "); pass the argmax / transposed edge ids computed for this block");
  TORCH_CHECK(kind == kStatusOk, op, ": a kernel reported an unknown status ", kind);
}

// Reads `status` back (one device sync) and throws what a kernel recorded in it.
inline void check_structure_status(const at::Tensor& status, const char* op, const StructureBounds& bounds) {
  const at::Tensor host = status.cpu();
  raise_structure_status(host.data_ptr<int64_t>(), op, bounds);
}

}  // namespace morphpipe::cuda
