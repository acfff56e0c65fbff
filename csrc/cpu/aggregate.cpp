// Fused CPU aggregation over a block's CSC: weighted sums, max with argmax, their backward
// passes, per-edge dot products and the transposed structure. Vertex-parallel and edge-sequential
// (OpenMP over destinations, dynamic scheduling), feature tiles accumulated in L1; no tensor of
// size nnz x features is ever allocated.
#include <torch/library.h>

#include <limits>
#include <tuple>

#include "common/aggregate_checks.h"
#include "cpu/aggregate_common.h"

#define MORPHPIPE_KERNELS "cpu/aggregate_kernels.h"
#include "cpu/for_each_capability.h"

namespace morphpipe {

namespace {

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
    MORPHPIPE_CPU_DISPATCH(isa::spmm_sum_kernel<scalar_t>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), x.data_ptr<scalar_t>(), x.size(0), F,
        optional_data<acc_t>(edge_weight), optional_data<acc_t>(src_scale), optional_data<acc_t>(dst_scale), self_loop,
        rows, order, out.data_ptr<scalar_t>()));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> spmm_sum_project_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& x, const std::optional<at::Tensor>& edge_weight,
    const std::optional<at::Tensor>& src_scale, const std::optional<at::Tensor>& dst_scale, bool self_loop,
    const at::Tensor& weight, const std::optional<at::Tensor>& row_order, bool keep_aggregate) {
  constexpr const char* op = "morphpipe::spmm_sum_project";
  check_spmm_sum_project(indptr, indices, x, edge_weight, src_scale, dst_scale, weight, row_order, op);
  check_csr_values(indptr, indices, x.size(0), op);
  const int64_t rows = indptr.numel() - 1, F = x.size(1), O = weight.size(0);
  const int64_t* order = optional_row_order(row_order, rows, op);
  const auto wt = weight.t().contiguous();
  auto out = at::empty({keep_aggregate ? rows : 0, F}, x.options());
  auto projected = at::empty({rows, O}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "spmm_sum_project_cpu", [&] {
    MORPHPIPE_CPU_DISPATCH(isa::spmm_sum_project_kernel<scalar_t>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), x.data_ptr<scalar_t>(), x.size(0), F,
        optional_data<scalar_t>(edge_weight), optional_data<scalar_t>(src_scale), optional_data<scalar_t>(dst_scale),
        self_loop, rows, order, wt.data_ptr<scalar_t>(), O, keep_aggregate ? out.data_ptr<scalar_t>() : nullptr,
        projected.data_ptr<scalar_t>()));
  });
  return {out, projected};
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
    MORPHPIPE_CPU_DISPATCH(isa::spmm_sum_scatter_kernel<scalar_t>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), grad.data_ptr<scalar_t>(), F,
        optional_data<acc_t>(edge_weight), optional_data<acc_t>(src_scale), optional_data<acc_t>(dst_scale),
        self_loop, rows, num_src, out.data_ptr<acc_t>()));
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
    MORPHPIPE_CPU_DISPATCH(isa::spmm_max_kernel<scalar_t>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), x.data_ptr<scalar_t>(), F,
        optional_data<acc_t>(edge_weight), rows, order, out.data_ptr<scalar_t>(), arg.data_ptr<int64_t>()));
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
    MORPHPIPE_CPU_DISPATCH(isa::spmm_max_backward_kernel<scalar_t>(
        indices.data_ptr<int64_t>(), arg, grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), F,
        optional_data<acc_t>(edge_weight), rows, need_grad_x ? grad_x.data_ptr<acc_t>() : nullptr,
        need_grad_weight ? grad_w.data_ptr<acc_t>() : nullptr));
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
    MORPHPIPE_CPU_DISPATCH(isa::sddmm_kernel<scalar_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(),
                                                       a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), a.size(1), rows,
                                                       out.data_ptr<acc_type<scalar_t>>()));
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
  m.impl("spmm_sum_project", &spmm_sum_project_cpu);
  m.impl("spmm_sum_scatter", &spmm_sum_scatter_cpu);
  m.impl("spmm_max", &spmm_max_cpu);
  m.impl("spmm_max_backward", &spmm_max_backward_cpu);
  m.impl("sddmm", &sddmm_cpu);
  m.impl("csr_transpose", &csr_transpose_cpu);
}

}  // namespace morphpipe
