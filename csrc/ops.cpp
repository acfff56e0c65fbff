// Every morphpipe op's schema, in one place; CPU kernels live in cpu/, CUDA kernels in cuda/
// and register themselves with TORCH_LIBRARY_IMPL for their dispatch key.
#include <torch/library.h>

TORCH_LIBRARY(morphpipe, m) {
  // Multi-hop uniform neighbour sampling without replacement from `seeds` over the CSC graph
  // (indptr, indices); fanouts[h] neighbours at hop h from the seeds, -1 for all.
  // Returns input_nodes (global ids, seeds first) and per-layer block indptr / indices
  // (local ids), input layer first.
  m.def("sample_neighbors(Tensor indptr, Tensor indices, Tensor seeds, int[] fanouts, int seed) "
        "-> (Tensor input_nodes, Tensor[] block_indptrs, Tensor[] block_indices)");
  // out[i] = source[index[i]] for a 2-D source (feature gathering).
  m.def("gather_rows(Tensor source, Tensor index) -> Tensor");
}
