// Fused CPU aggregation over a block's CSC: weighted sums, max with argmax, their backward
// passes, per-edge dot products and the transposed structure. Vertex-parallel and edge-sequential
// (OpenMP over destinations, dynamic scheduling), feature tiles accumulated in L1; no tensor of
// size nnz x features is ever allocated.
#include <torch/library.h>

#include <limits>
#include <tuple>

#include "common/aggregate_checks.h"
#include "cpu/aggregate_common.h"

namespace morphpipe {

namespace {

// out[i] = dst_scale[i] * (sum_e w[e] src_scale[j] x[j] + self_loop * src_scale[i] x[i]).
template <typename scalar_t>
void spmm_sum_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* x, int64_t num_x, int64_t F,
                     const acc_type<scalar_t>* w, const acc_type<scalar_t>* ss, const acc_type<scalar_t>* ds,
                     bool self_loop, int64_t rows, const int64_t* order, scalar_t* out) {
  using acc_t = acc_type<scalar_t>;
  const int64_t nnz = ptr[rows];
  for_each_row(rows, (nnz + rows) * F, [&](int64_t i) {
    acc_t buf[kFeatureTile];
    const acc_t scale = ds ? ds[i] : acc_t(1);
    const bool self = self_loop && i < num_x;
    for (int64_t f0 = 0; f0 < F; f0 += kFeatureTile) {
      const int64_t n = std::min(kFeatureTile, F - f0);
      std::fill(buf, buf + n, acc_t(0));
      if (self) axpy(buf, x + i * F + f0, ss ? ss[i] : acc_t(1), n);
      for (int64_t e = ptr[i]; e < ptr[i + 1]; ++e) {
        if (e + kPrefetchEdges < nnz) prefetch_row(x + idx[e + kPrefetchEdges] * F + f0, n);
        const int64_t j = idx[e];
        const acc_t coef = (w ? w[e] : acc_t(1)) * (ss ? ss[j] : acc_t(1));
        axpy(buf, x + j * F + f0, coef, n);
      }
      scalar_t* o = out + i * F + f0;
      for (int64_t f = 0; f < n; ++f) o[f] = static_cast<scalar_t>(buf[f] * scale);
    }
  }, order);
}

// The adjoint of spmm_sum, scattered to sources with atomic adds into an accumulation buffer.
template <typename scalar_t>
void spmm_sum_scatter_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* g, int64_t F,
                             const acc_type<scalar_t>* w, const acc_type<scalar_t>* ss,
                             const acc_type<scalar_t>* ds, bool self_loop, int64_t rows, int64_t num_src,
                             acc_type<scalar_t>* out) {
  using acc_t = acc_type<scalar_t>;
  const int64_t nnz = ptr[rows];
  for_each_row(rows, (nnz + rows) * F, [&](int64_t i) {
    const acc_t scale = ds ? ds[i] : acc_t(1);
    const scalar_t* gi = g + i * F;
    if (self_loop && i < num_src) atomic_axpy(out + i * F, gi, scale * (ss ? ss[i] : acc_t(1)), F);
    for (int64_t e = ptr[i]; e < ptr[i + 1]; ++e) {
      const int64_t j = idx[e];
      atomic_axpy(out + j * F, gi, scale * (w ? w[e] : acc_t(1)) * (ss ? ss[j] : acc_t(1)), F);
    }
  });
}

// out[i, f] = max_e w[e] x[j, f], arg[i, f] = the first edge e attaining it; zeros and -1 for empty rows.
template <typename scalar_t>
void spmm_max_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* x, int64_t F,
                     const acc_type<scalar_t>* w, int64_t rows, const int64_t* order, scalar_t* out, int64_t* arg) {
  using acc_t = acc_type<scalar_t>;
  const int64_t nnz = ptr[rows];
  for_each_row(rows, (nnz + rows) * F, [&](int64_t i) {
    acc_t best[kFeatureTile];
    int64_t where[kFeatureTile];
    const int64_t beg = ptr[i], end = ptr[i + 1];
    for (int64_t f0 = 0; f0 < F; f0 += kFeatureTile) {
      const int64_t n = std::min(kFeatureTile, F - f0);
      scalar_t* o = out + i * F + f0;
      int64_t* a = arg + i * F + f0;
      if (beg == end) {
        std::fill(o, o + n, scalar_t(0));
        std::fill(a, a + n, int64_t(-1));
        continue;
      }
      std::fill(best, best + n, -std::numeric_limits<acc_t>::infinity());
      std::fill(where, where + n, beg);
      for (int64_t e = beg; e < end; ++e) {
        if (e + kPrefetchEdges < nnz) prefetch_row(x + idx[e + kPrefetchEdges] * F + f0, n);
        const scalar_t* xj = x + idx[e] * F + f0;
        const acc_t coef = w ? w[e] : acc_t(1);
        for (int64_t f = 0; f < n; ++f) {
          const acc_t v = coef * static_cast<acc_t>(xj[f]);
          const bool better = v > best[f];
          best[f] = better ? v : best[f];
          where[f] = better ? e : where[f];
        }
      }
      for (int64_t f = 0; f < n; ++f) {
        o[f] = static_cast<scalar_t>(best[f]);
        a[f] = where[f];
      }
    }
  }, order);
}

// Routes each max's gradient to its argmax edge: grad_x by atomic scatter, grad_weight per edge.
template <typename scalar_t>
void spmm_max_backward_kernel(const int64_t* idx, const int64_t* arg, const scalar_t* g, const scalar_t* x,
                              int64_t F, const acc_type<scalar_t>* w, int64_t rows, acc_type<scalar_t>* grad_x,
                              acc_type<scalar_t>* grad_w) {
  using acc_t = acc_type<scalar_t>;
  for_each_row(rows, rows * F, [&](int64_t i) {
    for (int64_t f = 0; f < F; ++f) {
      const int64_t e = arg[i * F + f];
      if (e < 0) continue;
      const int64_t j = idx[e];
      const acc_t gv = static_cast<acc_t>(g[i * F + f]);
      if (grad_x) {
        const acc_t v = gv * (w ? w[e] : acc_t(1));
#pragma omp atomic
        grad_x[j * F + f] += v;
      }
      // Edges of row i belong to row i alone: no other thread writes grad_w[e].
      if (grad_w) grad_w[e] += gv * static_cast<acc_t>(x[j * F + f]);
    }
  });
}

// out[e] = dot(a[i], b[indices[e]]) for every edge e of row i.
template <typename scalar_t>
void sddmm_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* a, const scalar_t* b, int64_t F,
                  int64_t rows, acc_type<scalar_t>* out) {
  using acc_t = acc_type<scalar_t>;
  const int64_t nnz = ptr[rows];
  for_each_row(rows, (nnz + rows) * F, [&](int64_t i) {
    const scalar_t* ai = a + i * F;
    for (int64_t e = ptr[i]; e < ptr[i + 1]; ++e) {
      if (e + kPrefetchEdges < nnz) prefetch_row(b + idx[e + kPrefetchEdges] * F, F);
      const scalar_t* bj = b + idx[e] * F;
      acc_t dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t f = 0; f < F; ++f) dot += static_cast<acc_t>(ai[f]) * static_cast<acc_t>(bj[f]);
      out[e] = dot;
    }
  });
}

at::Tensor spmm_sum_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& x,
                        const std::optional<at::Tensor>& edge_weight, const std::optional<at::Tensor>& src_scale,
                        const std::optional<at::Tensor>& dst_scale, bool self_loop,
                        const std::optional<at::Tensor>& row_order) {
  constexpr const char* op = "morphpipe::spmm_sum";
  check_spmm_sum(indptr, indices, x, edge_weight, src_scale, dst_scale, row_order, op);
  check_csr_values(indptr, indices, x.size(0), op);
  const int64_t rows = indptr.numel() - 1, F = x.size(1);
  const int64_t* order = optional_row_order(row_order, rows, op);
  auto out = at::empty({rows, F}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "spmm_sum_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    spmm_sum_kernel<scalar_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), x.data_ptr<scalar_t>(),
                              x.size(0), F, optional_data<acc_t>(edge_weight), optional_data<acc_t>(src_scale),
                              optional_data<acc_t>(dst_scale), self_loop, rows, order, out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor spmm_sum_scatter_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& grad,
                                const std::optional<at::Tensor>& edge_weight,
                                const std::optional<at::Tensor>& src_scale,
                                const std::optional<at::Tensor>& dst_scale, bool self_loop, int64_t num_src) {
  constexpr const char* op = "morphpipe::spmm_sum_scatter";
  check_spmm_sum_scatter(indptr, indices, grad, edge_weight, src_scale, dst_scale, self_loop, num_src, op);
  check_csr_values(indptr, indices, num_src, op);
  const int64_t rows = indptr.numel() - 1, F = grad.size(1);
  const auto acc = accumulate_dtype(grad);
  auto out = at::zeros({num_src, F}, grad.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "spmm_sum_scatter_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    spmm_sum_scatter_kernel<scalar_t>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), grad.data_ptr<scalar_t>(), F,
        optional_data<acc_t>(edge_weight), optional_data<acc_t>(src_scale), optional_data<acc_t>(dst_scale),
        self_loop, rows, num_src, out.data_ptr<acc_t>());
  });
  return out.to(grad.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> spmm_max_cpu(const at::Tensor& indptr, const at::Tensor& indices,
                                                const at::Tensor& x, const std::optional<at::Tensor>& edge_weight,
                                                const std::optional<at::Tensor>& row_order) {
  constexpr const char* op = "morphpipe::spmm_max";
  check_spmm_max(indptr, indices, x, edge_weight, row_order, op);
  check_csr_values(indptr, indices, x.size(0), op);
  const int64_t rows = indptr.numel() - 1, F = x.size(1);
  const int64_t* order = optional_row_order(row_order, rows, op);
  auto out = at::empty({rows, F}, x.options());
  auto arg = at::empty({rows, F}, x.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "spmm_max_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    spmm_max_kernel<scalar_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), x.data_ptr<scalar_t>(), F,
                              optional_data<acc_t>(edge_weight), rows, order, out.data_ptr<scalar_t>(),
                              arg.data_ptr<int64_t>());
  });
  return {out, arg};
}

std::tuple<at::Tensor, at::Tensor> spmm_max_backward_cpu(const at::Tensor& indices, const at::Tensor& argmax,
                                                         const at::Tensor& grad, const at::Tensor& x,
                                                         const std::optional<at::Tensor>& edge_weight,
                                                         bool need_grad_x, bool need_grad_weight) {
  constexpr const char* op = "morphpipe::spmm_max_backward";
  check_spmm_max_backward(indices, argmax, grad, x, edge_weight, op);
  const int64_t nnz = indices.numel(), rows = grad.size(0), F = grad.size(1), num_src = x.size(0);
  const StructureBounds bounds{rows, nnz, num_src};
  check_index_values(indices, num_src, op, bounds);
  check_edge_ids(argmax, -1, op, bounds);
  const int64_t* arg = argmax.data_ptr<int64_t>();
  const auto acc = accumulate_dtype(grad);
  at::Tensor grad_x = need_grad_x ? at::zeros({num_src, F}, grad.options().dtype(acc)) : at::Tensor();
  at::Tensor grad_w = need_grad_weight ? at::zeros({nnz}, grad.options().dtype(acc)) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "spmm_max_backward_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    spmm_max_backward_kernel<scalar_t>(indices.data_ptr<int64_t>(), arg, grad.data_ptr<scalar_t>(),
                                       x.data_ptr<scalar_t>(), F, optional_data<acc_t>(edge_weight), rows,
                                       need_grad_x ? grad_x.data_ptr<acc_t>() : nullptr,
                                       need_grad_weight ? grad_w.data_ptr<acc_t>() : nullptr);
  });
  return {need_grad_x ? grad_x.to(grad.scalar_type()) : at::Tensor(), grad_w};
}

at::Tensor sddmm_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& a, const at::Tensor& b) {
  constexpr const char* op = "morphpipe::sddmm";
  check_sddmm(indptr, indices, a, b, op);
  check_csr_values(indptr, indices, b.size(0), op);
  const int64_t rows = indptr.numel() - 1;
  auto out = at::empty({indices.numel()}, a.options().dtype(accumulate_dtype(a)));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "sddmm_cpu", [&] {
    sddmm_kernel<scalar_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), a.data_ptr<scalar_t>(),
                           b.data_ptr<scalar_t>(), a.size(1), rows, out.data_ptr<acc_type<scalar_t>>());
  });
  return out;
}

// Counting sort of the edges by source: out-edges of every source, destinations ascending.
std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose_cpu(const at::Tensor& indptr, const at::Tensor& indices,
                                                                 int64_t num_src) {
  constexpr const char* op = "morphpipe::csr_transpose";
  check_csr_transpose(indptr, indices, num_src, op);
  check_csr_values(indptr, indices, num_src, op);
  const int64_t rows = indptr.numel() - 1, nnz = indices.numel();
  const int64_t* ptr = indptr.data_ptr<int64_t>();
  const int64_t* idx = indices.data_ptr<int64_t>();
  auto t_indptr = at::zeros({num_src + 1}, indptr.options());
  auto t_dst = at::empty({nnz}, indptr.options());
  auto t_eid = at::empty({nnz}, indptr.options());
  int64_t* tp = t_indptr.data_ptr<int64_t>();
  for (int64_t e = 0; e < nnz; ++e) ++tp[idx[e] + 1];
  for (int64_t j = 0; j < num_src; ++j) tp[j + 1] += tp[j];
  std::vector<int64_t> cursor(tp, tp + num_src);
  int64_t* td = t_dst.data_ptr<int64_t>();
  int64_t* te = t_eid.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t e = ptr[i]; e < ptr[i + 1]; ++e) {
      const int64_t slot = cursor[idx[e]]++;
      td[slot] = i;
      te[slot] = e;
    }
  }
  return {t_indptr, t_dst, t_eid};
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) {
  m.impl("spmm_sum", &spmm_sum_cpu);
  m.impl("spmm_sum_scatter", &spmm_sum_scatter_cpu);
  m.impl("spmm_max", &spmm_max_cpu);
  m.impl("spmm_max_backward", &spmm_max_backward_cpu);
  m.impl("sddmm", &sddmm_cpu);
  m.impl("csr_transpose", &csr_transpose_cpu);
}

}  // namespace morphpipe
