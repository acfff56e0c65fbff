// The bad values a kernel can meet inside its inputs (an index, an indptr entry, a row_order entry, an edge
// id, a seed) and, for a block's structure, the error each raises, worded once for both devices: the CPU
// kernels find the first bad value by a scan before they run, the CUDA kernels report one through their
// status record (cuda/status.cuh) and the host raises it here.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>

namespace morphpipe {

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

// The bounds a structure's entries must respect, for the error text.
struct StructureBounds {
  int64_t rows;     // indptr has rows + 1 entries
  int64_t nnz;      // indptr runs from 0 to nnz; edge ids lie in [0, nnz)
  int64_t num_src;  // indices lie in [0, num_src)
};

// Throws the error for a bad structure value of `kind` at `position` (see StatusKind); returns for kStatusOk.
inline void raise_structure_error(int64_t kind, int64_t position, int64_t value, const char* op,
                                  const StructureBounds& bounds) {
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

}  // namespace morphpipe
