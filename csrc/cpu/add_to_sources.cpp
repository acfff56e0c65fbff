// Op `morphpipe::add_to_sources` (CPU only): out[u] += values[v] for every edge u -> v of the CSC whose destination
// v lies in [begin, end) and has a non-zero value: the pass over the edges behind the expected-access hotness of
// feature rows (morphpipe/sampling/access_hotness.py), reading the memory-mapped indices in place (int32 or int64).
// Each OpenMP thread owns a range of source ids and adds in edge order, so the sums are the same run after run.
#include <torch/library.h>

#include <omp.h>

#include <algorithm>
#include <atomic>

#include "common/tensor_checks.h"
#include "cpu/neighbor_sampler.h"

namespace morphpipe {

namespace {

template <typename index_t>
void add_to_sources_kernel(const int64_t* indptr, const index_t* indices, const double* values, int64_t begin,
                           int64_t end, int64_t num_nodes, int64_t num_edges, double* out,
                           std::atomic<int64_t>& bad_dst, std::atomic<int64_t>& bad_edge) {
  constexpr int64_t kPrefetch = 16;  // edges ahead: each an out[] slot in a random line
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t per = num_nodes / threads, extra = num_nodes % threads;
    const int64_t low = thread * per + std::min<int64_t>(thread, extra);
    const int64_t high = low + per + (thread < extra ? 1 : 0);
    for (int64_t dst = begin; dst < end; ++dst) {
      const double value = values[dst];
      if (value == 0.0) continue;
      const int64_t first = indptr[dst], last = indptr[dst + 1];
      if (first < 0 || first > last || last > num_edges) {
        int64_t none = -1;
        bad_dst.compare_exchange_strong(none, dst);
        continue;
      }
      for (int64_t edge = first; edge < last; ++edge) {
        if (edge + kPrefetch < last) {
          const int64_t ahead = static_cast<int64_t>(indices[edge + kPrefetch]);
          if (ahead >= low && ahead < high) __builtin_prefetch(out + ahead, 1);
        }
        const int64_t source = static_cast<int64_t>(indices[edge]);
        if (source >= low && source < high) {
          out[source] += value;
        } else if ((source < 0 || source >= num_nodes) && thread == 0) {
          int64_t none = -1;
          bad_edge.compare_exchange_strong(none, edge);
        }
      }
    }
  }
}

void add_to_sources_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values, int64_t begin,
                        int64_t end, at::Tensor& out) {
  constexpr const char* op = "morphpipe::add_to_sources";
  check_cpu_topology(indptr, indices);
  const int64_t num_nodes = indptr.numel() - 1;
  for (const auto& [name, tensor] : {std::pair<const char*, const at::Tensor&>{"values", values}, {"out", out}}) {
    TORCH_CHECK(tensor.scalar_type() == at::kDouble && tensor.dim() == 1 && tensor.numel() == num_nodes, op, ": ",
                name, " must be float64 with one value per node, shape [", num_nodes, "], got ", tensor.scalar_type(),
                " of shape ", tensor.sizes());
    check_on(tensor, indptr.device(), op, name);
  }
  TORCH_CHECK(0 <= begin && begin <= end && end <= num_nodes, op, ": the destination range [", begin, ", ", end,
              ") must lie inside [0, ", num_nodes, "]");
  const int64_t* ptr = indptr.data_ptr<int64_t>();
  TORCH_CHECK(ptr[begin] >= 0 && ptr[begin] <= ptr[end] && ptr[end] <= indices.numel(), op,
              ": indptr[", begin, "..", end, "] = [", ptr[begin], ", ", ptr[end], ") is not a range of the ",
              indices.numel(), " edges; rebuild the CSC and validate the graph (GraphStore.validate)");
  std::atomic<int64_t> bad_dst{-1}, bad_edge{-1};
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "add_to_sources_cpu", [&] {
    add_to_sources_kernel<index_t>(ptr, indices.data_ptr<index_t>(), values.data_ptr<double>(), begin, end,
                                   num_nodes, indices.numel(), out.data_ptr<double>(), bad_dst, bad_edge);
  });
  const int64_t dst = bad_dst.load(), edge = bad_edge.load();
  TORCH_CHECK(dst < 0, op, ": node ", dst, " has the neighbour range indptr[", dst, "..", dst + 1, "] = [", ptr[dst],
              ", ", ptr[dst + 1], "), not inside [0, ", indices.numel(),
              "] and non-decreasing; rebuild the CSC and validate the graph (GraphStore.validate)");
  TORCH_CHECK(edge < 0, op, ": indices[", edge, "] holds a node id outside [0, ", num_nodes,
              "); validate the graph (GraphStore.validate) before computing its hotness");
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) { m.impl("add_to_sources", &add_to_sources_cpu); }

}  // namespace morphpipe
