// Fused multi-head GAT on CPU (Seastar's recipe): per destination and head, score + leaky ReLU +
// softmax + weighted aggregation in one vertex-parallel pass. Forward keeps only two scalars per
// destination and head (softmax max and denominator); backward keeps per-edge scalars per head.
// `h` is [num_src, Hh, F] with Hh == heads, or Hh == 1 for features shared by every head
// (aggregate-then-project GAT). Self loops follow the prefix convention: destination i is source i.
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "common/gat_checks.h"
#include "cpu/aggregate_common.h"

#define MORPHPIPE_KERNELS "cpu/gat_kernels.h"
#include "cpu/for_each_capability.h"

namespace morphpipe {

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cpu(const at::Tensor& indptr, const at::Tensor& indices,
                                                               const at::Tensor& h, const at::Tensor& score_src,
                                                               const at::Tensor& score_dst, double negative_slope,
                                                               bool self_loop,
                                                               const std::optional<at::Tensor>& row_order) {
  constexpr const char* op = "morphpipe::gat_forward";
  const GatShape s = check_gat(indptr, indices, h, score_src, score_dst, self_loop, row_order, op);
  check_csr_values(indptr, indices, s.num_src, op);
  const int64_t* order = optional_row_order(row_order, s.num_dst, op);
  auto out = at::empty({s.num_dst, s.heads, s.F}, h.options());
  auto stat_options = h.options().dtype(accumulate_dtype(h));
  auto row_max = at::empty({s.num_dst, s.heads}, stat_options);
  auto row_sum = at::empty({s.num_dst, s.heads}, stat_options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "gat_forward_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    MORPHPIPE_CPU_DISPATCH(isa::gat_forward_kernel<scalar_t>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), h.data_ptr<scalar_t>(), score_src.data_ptr<acc_t>(),
        score_dst.data_ptr<acc_t>(), static_cast<acc_t>(negative_slope), self_loop, s, order,
        out.data_ptr<scalar_t>(), row_max.data_ptr<acc_t>(), row_sum.data_ptr<acc_t>()));
  });
  return {out, row_max, row_sum};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gat_backward_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& h, const at::Tensor& score_src,
    const at::Tensor& score_dst, const at::Tensor& row_max, const at::Tensor& row_sum, const at::Tensor& grad_out,
    double negative_slope, bool self_loop, const std::optional<at::Tensor>& row_order) {
  constexpr const char* op = "morphpipe::gat_backward";
  const GatShape s = check_gat_backward(indptr, indices, h, score_src, score_dst, row_max, row_sum, grad_out,
                                        self_loop, row_order, op);
  check_csr_values(indptr, indices, s.num_src, op);
  const int64_t* order = optional_row_order(row_order, s.num_dst, op);
  auto options = h.options().dtype(accumulate_dtype(h));
  auto alpha = at::empty({s.nnz, s.heads}, options);
  auto grad_edge = at::empty({s.nnz, s.heads}, options);
  auto alpha_self = at::zeros({self_loop ? s.num_dst : 0, s.heads}, options);
  auto grad_self = at::zeros({self_loop ? s.num_dst : 0, s.heads}, options);
  auto grad_dst = at::empty({s.num_dst, s.heads}, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "gat_backward_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    MORPHPIPE_CPU_DISPATCH(isa::gat_backward_kernel<scalar_t>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), h.data_ptr<scalar_t>(), score_src.data_ptr<acc_t>(),
        score_dst.data_ptr<acc_t>(), row_max.data_ptr<acc_t>(), row_sum.data_ptr<acc_t>(),
        grad_out.data_ptr<scalar_t>(), static_cast<acc_t>(negative_slope), self_loop, s, order,
        alpha.data_ptr<acc_t>(), alpha_self.data_ptr<acc_t>(), grad_edge.data_ptr<acc_t>(),
        grad_self.data_ptr<acc_t>(), grad_dst.data_ptr<acc_t>()));
  });
  return {alpha, alpha_self, grad_edge, grad_self, grad_dst};
}

at::Tensor gat_grad_h_cpu(const at::Tensor& t_indptr, const at::Tensor& t_dst, const at::Tensor& t_eid,
                          const at::Tensor& alpha, const at::Tensor& alpha_self, const at::Tensor& grad_out,
                          int64_t h_heads) {
  constexpr const char* op = "morphpipe::gat_grad_h";
  check_gat_grad_h(t_indptr, t_dst, t_eid, alpha, alpha_self, grad_out, h_heads, op);
  const int64_t num_dst = grad_out.size(0), H = grad_out.size(1), F = grad_out.size(2);
  const int64_t num_src = t_indptr.numel() - 1, nnz = t_eid.numel();
  // The transposed structure's "sources" are the destinations: t_dst entries lie in [0, num_dst).
  check_csr_values(t_indptr, t_dst, num_dst, op);
  check_edge_ids(t_eid, 0, op, {num_src, nnz, num_dst});
  auto out = at::empty({num_src, h_heads, F}, grad_out.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_out.scalar_type(), "gat_grad_h_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    MORPHPIPE_CPU_DISPATCH(isa::gat_grad_h_kernel<scalar_t>(
        t_indptr.data_ptr<int64_t>(), t_dst.data_ptr<int64_t>(), t_eid.data_ptr<int64_t>(), alpha.data_ptr<acc_t>(),
        alpha_self.numel() ? alpha_self.data_ptr<acc_t>() : nullptr, grad_out.data_ptr<scalar_t>(), num_src,
        num_dst, H, h_heads, F, out.data_ptr<scalar_t>()));
  });
  return out;
}

at::Tensor gat_grad_h_scatter_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& alpha,
                                  const at::Tensor& alpha_self, const at::Tensor& grad_out, int64_t num_src,
                                  int64_t h_heads) {
  constexpr const char* op = "morphpipe::gat_grad_h_scatter";
  check_gat_grad_h_scatter(indptr, indices, alpha, alpha_self, grad_out, num_src, h_heads, op);
  check_csr_values(indptr, indices, num_src, op);
  const int64_t num_dst = grad_out.size(0), H = grad_out.size(1), F = grad_out.size(2);
  const auto acc = accumulate_dtype(grad_out);
  auto out = at::zeros({num_src, h_heads, F}, grad_out.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_out.scalar_type(), "gat_grad_h_scatter_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    MORPHPIPE_CPU_DISPATCH(isa::gat_grad_h_scatter_kernel<scalar_t>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), alpha.data_ptr<acc_t>(),
        alpha_self.numel() ? alpha_self.data_ptr<acc_t>() : nullptr, grad_out.data_ptr<scalar_t>(), num_dst, H,
        h_heads, F, out.data_ptr<acc_t>()));
  });
  return out.to(grad_out.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) {
  m.impl("gat_forward", &gat_forward_cpu);
  m.impl("gat_backward", &gat_backward_cpu);
  m.impl("gat_grad_h", &gat_grad_h_cpu);
  m.impl("gat_grad_h_scatter", &gat_grad_h_scatter_cpu);
}

}  // namespace morphpipe
