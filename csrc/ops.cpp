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
  // One link-prediction batch: training positives `edge_ids` (pair_src[e] -> pair_dst[e]), num_negatives corrupted
  // destinations each (uniform, or by the cumulative weights negative_cdf [N]; reject_positives redraws edges of
  // the topology), every endpoint a seed (returned, sources and destinations first), the pairs in local ids of the
  // seeds, and sample_neighbors' outputs over the seeds with the positives (and reverses when undirected) left out
  // of the blocks when `exclude`. Same random choices as the CpuBatcher's edge task for the same seed.
  m.def("sample_edge_batch(Tensor indptr, Tensor indices, Tensor pair_src, Tensor pair_dst, Tensor edge_ids, "
        "int[] fanouts, int num_negatives, Tensor? negative_cdf, bool exclude, bool undirected, bool reject_positives, "
        "int seed) -> (Tensor seeds, Tensor src, Tensor dst, Tensor negative_dst, Tensor input_nodes, "
        "Tensor[] block_indptrs, Tensor[] block_indices)");
  // CPU only: out[u] += values[v] for every edge u -> v of the CSC (indptr, indices) with begin <= v < end and
  // values[v] != 0 (values, out: float64 [num_nodes]); deterministic sums. The expected-access hotness's edge pass.
  m.def("add_to_sources(Tensor indptr, Tensor indices, Tensor values, int begin, int end, Tensor(a!) out) -> ()");
  // out[i] = source[index[i]] for a 2-D source (feature gathering).
  m.def("gather_rows(Tensor source, Tensor index) -> Tensor");
  // CPU only: the same into a given contiguous [index.numel(), width] out of source's dtype, written with
  // streaming stores as CpuBatcher writes its recycled batch buffers (the gather ceiling's loop).
  m.def("gather_rows_out(Tensor source, Tensor index, Tensor(a!) out) -> ()");
  // Route 1 (CUDA only): sample_neighbors with topology in pinned host memory (read over UVA) and the
  // neighbour lists of hot nodes in a device cache: cache_slot int32 [N] (row in cache_indptr or -1).
  m.def("sample_neighbors_cached(Tensor indptr, Tensor indices, Tensor seeds, int[] fanouts, int seed, "
        "Tensor cache_slot, Tensor cache_indptr, Tensor cache_indices) "
        "-> (Tensor input_nodes, Tensor[] block_indptrs, Tensor[] block_indices)");
  // Route 1 (CUDA only): gather_rows reading row v from cache_rows[cache_slot[v]] when cache_slot[v] >= 0.
  // check_index=False skips the bounds report's blocking read-back, for indices the sampler produced.
  m.def("gather_rows_cached(Tensor source, Tensor index, Tensor cache_slot, Tensor cache_rows, "
        "bool check_index=True) -> Tensor");

  // Fused aggregation over a block's CSC (rows = destinations, indices = local source ids in
  // [0, x.size(0))); no nnz x F tensor is allocated. `row_order`, a permutation of the rows
  // (e.g. heaviest first, Seastar), sets the order destinations are processed in. Sums run in the accumulation dtype (float
  // for float16/bfloat16, else x's), which edge_weight / src_scale / dst_scale must have.
  // out[i] = dst_scale[i] * (sum_e edge_weight[e] src_scale[j] x[j] + self_loop src_scale[i] x[i]),
  // the self loop applying to rows i < x.size(0) (prefix convention).
  m.def("spmm_sum(Tensor indptr, Tensor indices, Tensor x, Tensor? edge_weight, Tensor? src_scale, "
        "Tensor? dst_scale, bool self_loop, Tensor? row_order=None) -> Tensor");
  // spmm_sum and its output's projection out @ weight^T (weight [O, F]) in one pass (CPU, float32/float64): the
  // aggregate rows are projected while in cache (GCN's aggregate-then-project layer). -> (out, projected [rows, O]);
  // keep_aggregate=false: the aggregate is never written and out is empty ([0, F]; no weight gradient wants it).
  m.def("spmm_sum_project(Tensor indptr, Tensor indices, Tensor x, Tensor? edge_weight, Tensor? src_scale, "
        "Tensor? dst_scale, bool self_loop, Tensor weight, Tensor? row_order=None, bool keep_aggregate=True) -> "
        "(Tensor out, Tensor projected)");
  // The adjoint of spmm_sum ([rows, F] -> [num_src, F]) by atomic scatter to the sources.
  m.def("spmm_sum_scatter(Tensor indptr, Tensor indices, Tensor grad, Tensor? edge_weight, Tensor? src_scale, "
        "Tensor? dst_scale, bool self_loop, int num_src) -> Tensor");
  // Per-row max of edge_weight[e] x[j] and the CSC position of the first edge attaining it
  // (argmax int64 [rows, F]); empty rows give 0 and -1.
  m.def("spmm_max(Tensor indptr, Tensor indices, Tensor x, Tensor? edge_weight, Tensor? row_order=None) -> "
        "(Tensor out, Tensor argmax)");
  // Gradients of spmm_max through its argmax: grad_x [num_src, F] and grad_weight [nnz] (acc dtype).
  m.def("spmm_max_backward(Tensor indices, Tensor argmax, Tensor grad, Tensor x, Tensor? edge_weight, "
        "bool need_grad_x, bool need_grad_weight) -> (Tensor grad_x, Tensor grad_weight)");
  // out[e] = dot(a[i], b[indices[e]]) for each edge e of row i (edge-weight gradients), acc dtype.
  m.def("sddmm(Tensor indptr, Tensor indices, Tensor a, Tensor b) -> Tensor");
  // The transposed structure: per source its out-edges' destinations (ascending) and CSC positions.
  m.def("csr_transpose(Tensor indptr, Tensor indices, int num_src) -> (Tensor t_indptr, Tensor t_dst, Tensor t_eid)");
  // The non-zeros of a dense 2-D x in CSR: indptr [rows + 1], column indices and values (row-major).
  m.def("dense_to_csr(Tensor x) -> (Tensor indptr, Tensor indices, Tensor values)");
  // Fused multi-head GAT: h [num_src, heads or 1, F], scores [num_src | num_dst, heads] in the acc
  // dtype; edge j -> i scores leaky_relu(score_src[j] + score_dst[i]), softmax over the in-edges
  // (plus the prefix self loop), weighted sum of h[j]. Keeps the softmax max and sum per row/head.
  m.def("gat_forward(Tensor indptr, Tensor indices, Tensor h, Tensor score_src, Tensor score_dst, "
        "float negative_slope, bool self_loop, Tensor? row_order=None) -> (Tensor out, Tensor row_max, Tensor row_sum)");
  // Per-edge scalars per head: attention alpha and the raw-score gradient of every edge and self
  // loop, and grad_score_dst [num_dst, heads].
  m.def("gat_backward(Tensor indptr, Tensor indices, Tensor h, Tensor score_src, Tensor score_dst, "
        "Tensor row_max, Tensor row_sum, Tensor grad_out, float negative_slope, bool self_loop, "
        "Tensor? row_order=None) -> "
        "(Tensor alpha, Tensor alpha_self, Tensor grad_edge, Tensor grad_self, Tensor grad_score_dst)");
  // grad_h [num_src, h_heads, F] from alpha and grad_out over the transposed structure (atomic-free);
  // h_heads == 1 sums the heads (shared features). alpha_self is empty without self loops.
  m.def("gat_grad_h(Tensor t_indptr, Tensor t_dst, Tensor t_eid, Tensor alpha, Tensor alpha_self, "
        "Tensor grad_out, int h_heads) -> Tensor");
  // The same gradient scattered from the destinations with atomic adds.
  m.def("gat_grad_h_scatter(Tensor indptr, Tensor indices, Tensor alpha, Tensor alpha_self, Tensor grad_out, "
        "int num_src, int h_heads) -> Tensor");
  // Link prediction's dot decoder: out[i] = <h[src[i]], h[dst[i]]> (h's dtype, summed in the accumulation dtype)
  // for a list of pairs over one embedding table h [rows, width], no [pairs, width] tensor made.
  m.def("pair_dot(Tensor h, Tensor src, Tensor dst) -> Tensor");
  // Its gradient wrt h from grad [pairs]: grad_h[src[i]] += grad[i] h[dst[i]], grad_h[dst[i]] += grad[i] h[src[i]],
  // summed per row in pair order (deterministic).
  m.def("pair_dot_backward(Tensor h, Tensor src, Tensor dst, Tensor grad) -> Tensor");
  // Between layers: out = keep * act(x + bias) / (1 - p) for x [rows, F], activation 'relu' or 'identity', keep
  // drawn per element by a counter-based generator from `seed` (common/dropout_mask.h), mask as int32 bit words; p=0: no mask.
  m.def("bias_act_dropout(Tensor x, Tensor? bias, str activation, float p, int seed) -> (Tensor out, Tensor mask)");
  // Its backward from the output and the mask: grad_x, and grad_bias (column sums of grad_x) when asked.
  m.def("bias_act_dropout_backward(Tensor grad, Tensor out, Tensor mask, str activation, float p, "
        "bool need_bias_grad) -> (Tensor grad_x, Tensor grad_bias)");
  // The backward of mean(relu + dropout of x) and of its own rows x[:self_rows], one pass per row of x (a SAGE
  // layer after the fused activation; CPU only): over the transposed structure (t_indptr [rows + 1], t_dst in
  // [0, num_dst)), grad_x[j] = (sum_e scale[i] grad[i] + [j < self_rows] self_grad[j]) * (out[j] > 0) / (1 - p),
  // i = t_dst[e], and grad_bias its column sums; out is the activation's output.
  m.def("relu_mean_backward(Tensor t_indptr, Tensor t_dst, Tensor grad, Tensor scale, Tensor? self_grad, "
        "Tensor out, float p) -> (Tensor grad_x, Tensor grad_bias)");
}
