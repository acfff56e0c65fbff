// Fused CUDA aggregation over a block's CSC: weighted sums (atomic-free forward, one thread group
// per destination with partial sums in registers), max with argmax, their backward passes
// (atomic scatter, or the forward kernel on the transposed structure), per-edge dot products and
// the transposed structure. No tensor of size nnz x features is allocated.
#include <torch/library.h>

#include <limits>
#include <tuple>

#include "common/aggregate_checks.h"
#include "cuda/aggregate_common.cuh"

namespace morphpipe::cuda {

namespace {

template <typename scalar_t, int G>
__global__ void spmm_sum_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                                const scalar_t* __restrict__ x, int64_t num_x, int64_t F,
                                const acc_type<scalar_t>* __restrict__ w, const acc_type<scalar_t>* __restrict__ ss,
                                const acc_type<scalar_t>* __restrict__ ds, bool self_loop, int64_t rows, int64_t nnz,
                                const int64_t* __restrict__ order, scalar_t* __restrict__ out, int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % G;
  int64_t i, begin, end;
  if (!this_group_row<G>(rows, order, indptr, nnz, status, i, begin, end)) return;
  const acc_t scale = ds ? ds[i] : acc_t(1);
  const bool self = self_loop && i < num_x;
  const acc_t self_coef = self ? (ss ? ss[i] : acc_t(1)) : acc_t(0);
  for (int64_t f = lane; f < F; f += G) {
    acc_t acc = self ? self_coef * static_cast<acc_t>(x[i * F + f]) : acc_t(0);
    for (int64_t e = begin; e < end; ++e) {
      const int64_t j = indices[e];
      if (!valid_index(j, num_x, status, kStatusIndexOutOfRange, e)) continue;
      const acc_t coef = (w ? w[e] : acc_t(1)) * (ss ? ss[j] : acc_t(1));
      acc += coef * static_cast<acc_t>(x[j * F + f]);
    }
    out[i * F + f] = static_cast<scalar_t>(acc * scale);
  }
}

template <typename scalar_t, int G>
__global__ void spmm_sum_scatter_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                                        const scalar_t* __restrict__ g, int64_t F,
                                        const acc_type<scalar_t>* __restrict__ w,
                                        const acc_type<scalar_t>* __restrict__ ss,
                                        const acc_type<scalar_t>* __restrict__ ds, bool self_loop, int64_t rows,
                                        int64_t num_src, int64_t nnz, acc_type<scalar_t>* __restrict__ out,
                                        int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % G;
  int64_t i, begin, end;
  if (!this_group_row<G>(rows, nullptr, indptr, nnz, status, i, begin, end)) return;
  const acc_t scale = ds ? ds[i] : acc_t(1);
  for (int64_t f = lane; f < F; f += G) {
    const acc_t gv = scale * static_cast<acc_t>(g[i * F + f]);
    if (self_loop && i < num_src) atomicAdd(out + i * F + f, gv * (ss ? ss[i] : acc_t(1)));
    for (int64_t e = begin; e < end; ++e) {
      const int64_t j = indices[e];
      if (!valid_index(j, num_src, status, kStatusIndexOutOfRange, e)) continue;
      atomicAdd(out + j * F + f, gv * (w ? w[e] : acc_t(1)) * (ss ? ss[j] : acc_t(1)));
    }
  }
}

template <typename scalar_t, int G>
__global__ void spmm_max_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                                const scalar_t* __restrict__ x, int64_t num_x, int64_t F,
                                const acc_type<scalar_t>* __restrict__ w, int64_t rows, int64_t nnz,
                                const int64_t* __restrict__ order, scalar_t* __restrict__ out,
                                int64_t* __restrict__ arg, int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % G;
  int64_t i, begin, end;
  if (!this_group_row<G>(rows, order, indptr, nnz, status, i, begin, end)) return;
  for (int64_t f = lane; f < F; f += G) {
    // As the CPU kernel: start from -inf at the first edge and move only on a strictly larger value, so
    // NaNs never win (a row of NaNs and -infs gives -inf at its first edge); empty rows give 0 and -1.
    acc_t best = -std::numeric_limits<acc_t>::infinity();
    int64_t where = begin < end ? begin : -1;
    for (int64_t e = begin; e < end; ++e) {
      const int64_t j = indices[e];
      if (!valid_index(j, num_x, status, kStatusIndexOutOfRange, e)) continue;
      const acc_t v = (w ? w[e] : acc_t(1)) * static_cast<acc_t>(x[j * F + f]);
      if (v > best) {
        best = v;
        where = e;
      }
    }
    out[i * F + f] = static_cast<scalar_t>(where < 0 ? acc_t(0) : best);
    arg[i * F + f] = where;
  }
}

template <typename scalar_t>
__global__ void spmm_max_backward_kernel(const int64_t* __restrict__ indices, const int64_t* __restrict__ arg,
                                         const scalar_t* __restrict__ g, const scalar_t* __restrict__ x, int64_t F,
                                         const acc_type<scalar_t>* __restrict__ w, int64_t rows, int64_t num_src,
                                         int64_t nnz, acc_type<scalar_t>* __restrict__ grad_x,
                                         acc_type<scalar_t>* __restrict__ grad_w, int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= rows * F) return;
  const int64_t e = arg[item];
  if (e == -1 || !valid_index(e, nnz, status, kStatusEdgeOutOfRange, item)) return;
  const int64_t j = indices[e];
  if (!valid_index(j, num_src, status, kStatusIndexOutOfRange, e)) return;
  const int64_t f = item % F;
  const acc_t gv = static_cast<acc_t>(g[item]);
  if (grad_x) atomicAdd(grad_x + j * F + f, gv * (w ? w[e] : acc_t(1)));
  if (grad_w) atomicAdd(grad_w + e, gv * static_cast<acc_t>(x[j * F + f]));
}

template <typename scalar_t, int G>
__global__ void sddmm_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                             const scalar_t* __restrict__ a, const scalar_t* __restrict__ b, int64_t num_src,
                             int64_t F, int64_t rows, int64_t nnz, acc_type<scalar_t>* __restrict__ out,
                             int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % G;
  int64_t i, begin, end;
  if (!this_group_row<G>(rows, nullptr, indptr, nnz, status, i, begin, end)) return;
  const unsigned mask = group_mask<G>();
  for (int64_t e = begin; e < end; ++e) {
    const int64_t j = indices[e];
    const bool ok = valid_index(j, num_src, status, kStatusIndexOutOfRange, e);
    acc_t part = 0;
    if (ok) {
      for (int64_t f = lane; f < F; f += G) part += static_cast<acc_t>(a[i * F + f]) * static_cast<acc_t>(b[j * F + f]);
    }
    part = group_sum<G>(part, mask);
    if (lane == 0) out[e] = part;
  }
}

// Destination of every edge (the expanded indptr), one thread per destination; checks the sources too.
__global__ void edge_rows_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                                 int64_t rows, int64_t nnz, int64_t num_src, int64_t* __restrict__ dst,
                                 int64_t* status) {
  int64_t i, begin, end;
  if (!this_group_row<1>(rows, nullptr, indptr, nnz, status, i, begin, end)) return;
  for (int64_t e = begin; e < end; ++e) {
    dst[e] = i;
    valid_index(indices[e], num_src, status, kStatusIndexOutOfRange, e);
  }
}

at::Tensor spmm_sum_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& x,
                         const std::optional<at::Tensor>& edge_weight, const std::optional<at::Tensor>& src_scale,
                         const std::optional<at::Tensor>& dst_scale, bool self_loop,
                         const std::optional<at::Tensor>& row_order) {
  constexpr const char* op = "morphpipe::spmm_sum";
  check_spmm_sum(indptr, indices, x, edge_weight, src_scale, dst_scale, row_order, op);
  const auto device = indptr.device();
  const c10::cuda::CUDAGuard guard(device);
  const int64_t rows = indptr.numel() - 1, F = x.size(1), nnz = indices.numel();
  auto out = at::empty({rows, F}, x.options());
  if (rows == 0 || F == 0) return out;
  const int group = group_size(F);
  const int64_t* order = optional_data<int64_t>(row_order);
  const at::Tensor status = new_status(device);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "spmm_sum_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    const acc_t* w = optional_data<acc_t>(edge_weight);
    const acc_t* ss = optional_data<acc_t>(src_scale);
    const acc_t* ds = optional_data<acc_t>(dst_scale);
    with_group_size(group, [&](auto g) {
      constexpr int G = decltype(g)::value;
      spmm_sum_kernel<scalar_t, G><<<blocks_for(rows, G), kThreadsPerBlock, 0, current_stream()>>>(
          indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), x.data_ptr<scalar_t>(), x.size(0), F, w, ss, ds,
          self_loop, rows, nnz, order, out.data_ptr<scalar_t>(), status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  check_structure_status(status, op, {rows, nnz, x.size(0)});
  return out;
}

at::Tensor spmm_sum_scatter_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& grad,
                                 const std::optional<at::Tensor>& edge_weight,
                                 const std::optional<at::Tensor>& src_scale,
                                 const std::optional<at::Tensor>& dst_scale, bool self_loop, int64_t num_src) {
  constexpr const char* op = "morphpipe::spmm_sum_scatter";
  check_spmm_sum_scatter(indptr, indices, grad, edge_weight, src_scale, dst_scale, self_loop, num_src, op);
  const auto device = indptr.device();
  const int64_t rows = indptr.numel() - 1, nnz = indices.numel();
  const c10::cuda::CUDAGuard guard(device);
  const int64_t F = grad.size(1);
  const auto acc = accumulate_dtype(grad);
  auto out = at::zeros({num_src, F}, grad.options().dtype(acc));
  if (rows == 0 || F == 0) return out.to(grad.scalar_type());
  const at::Tensor status = new_status(device);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "spmm_sum_scatter_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    const acc_t* w = optional_data<acc_t>(edge_weight);
    const acc_t* ss = optional_data<acc_t>(src_scale);
    const acc_t* ds = optional_data<acc_t>(dst_scale);
    with_group_size(group_size(F), [&](auto g) {
      constexpr int G = decltype(g)::value;
      spmm_sum_scatter_kernel<scalar_t, G>
          <<<blocks_for(rows, G), kThreadsPerBlock, 0, current_stream()>>>(
              indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), grad.data_ptr<scalar_t>(), F, w, ss, ds,
              self_loop, rows, num_src, nnz, out.data_ptr<acc_t>(), status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  check_structure_status(status, op, {rows, nnz, num_src});
  return out.to(grad.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> spmm_max_cuda(const at::Tensor& indptr, const at::Tensor& indices,
                                                 const at::Tensor& x, const std::optional<at::Tensor>& edge_weight,
                                                 const std::optional<at::Tensor>& row_order) {
  constexpr const char* op = "morphpipe::spmm_max";
  check_spmm_max(indptr, indices, x, edge_weight, row_order, op);
  const auto device = indptr.device();
  const c10::cuda::CUDAGuard guard(device);
  const int64_t rows = indptr.numel() - 1, F = x.size(1), nnz = indices.numel();
  auto out = at::empty({rows, F}, x.options());
  auto arg = at::empty({rows, F}, x.options().dtype(at::kLong));
  if (rows == 0 || F == 0) return {out, arg};
  const int64_t* order = optional_data<int64_t>(row_order);
  const at::Tensor status = new_status(device);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "spmm_max_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    const acc_t* w = optional_data<acc_t>(edge_weight);
    with_group_size(group_size(F), [&](auto g) {
      constexpr int G = decltype(g)::value;
      spmm_max_kernel<scalar_t, G><<<blocks_for(rows, G), kThreadsPerBlock, 0, current_stream()>>>(
          indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), x.data_ptr<scalar_t>(), x.size(0), F, w, rows,
          nnz, order, out.data_ptr<scalar_t>(), arg.data_ptr<int64_t>(), status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  check_structure_status(status, op, {rows, nnz, x.size(0)});
  return {out, arg};
}

std::tuple<at::Tensor, at::Tensor> spmm_max_backward_cuda(const at::Tensor& indices, const at::Tensor& argmax,
                                                          const at::Tensor& grad, const at::Tensor& x,
                                                          const std::optional<at::Tensor>& edge_weight,
                                                          bool need_grad_x, bool need_grad_weight) {
  constexpr const char* op = "morphpipe::spmm_max_backward";
  check_spmm_max_backward(indices, argmax, grad, x, edge_weight, op);
  const auto device = indices.device();
  const c10::cuda::CUDAGuard guard(device);
  const int64_t nnz = indices.numel(), rows = grad.size(0), F = grad.size(1), num_src = x.size(0);
  const auto acc = accumulate_dtype(grad);
  at::Tensor grad_x = need_grad_x ? at::zeros({num_src, F}, grad.options().dtype(acc)) : at::Tensor();
  at::Tensor grad_w = need_grad_weight ? at::zeros({nnz}, grad.options().dtype(acc)) : at::Tensor();
  if (rows * F > 0 && (need_grad_x || need_grad_weight)) {
    const at::Tensor status = new_status(device);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "spmm_max_backward_cuda", [&] {
      using acc_t = acc_type<scalar_t>;
      const acc_t* w = optional_data<acc_t>(edge_weight);
      spmm_max_backward_kernel<scalar_t>
          <<<blocks_for(rows * F, 1), kThreadsPerBlock, 0, current_stream()>>>(
              indices.data_ptr<int64_t>(), argmax.data_ptr<int64_t>(), grad.data_ptr<scalar_t>(),
              x.data_ptr<scalar_t>(), F, w, rows, num_src, nnz, need_grad_x ? grad_x.data_ptr<acc_t>() : nullptr,
              need_grad_weight ? grad_w.data_ptr<acc_t>() : nullptr, status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    check_structure_status(status, op, {rows, nnz, num_src});
  }
  return {need_grad_x ? grad_x.to(grad.scalar_type()) : at::Tensor(), grad_w};
}

at::Tensor sddmm_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& a, const at::Tensor& b) {
  constexpr const char* op = "morphpipe::sddmm";
  check_sddmm(indptr, indices, a, b, op);
  const auto device = indptr.device();
  const int64_t rows = indptr.numel() - 1, nnz = indices.numel();
  const c10::cuda::CUDAGuard guard(device);
  auto out = at::zeros({nnz}, a.options().dtype(accumulate_dtype(a)));
  if (rows == 0 || nnz == 0) return out;
  const int64_t F = a.size(1);
  const at::Tensor status = new_status(device);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "sddmm_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    with_group_size(group_size(F), [&](auto g) {
      constexpr int G = decltype(g)::value;
      sddmm_kernel<scalar_t, G><<<blocks_for(rows, G), kThreadsPerBlock, 0, current_stream()>>>(
          indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
          b.size(0), F, rows, nnz, out.data_ptr<acc_t>(), status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  check_structure_status(status, op, {rows, nnz, b.size(0)});
  return out;
}

// Stable sort of the edges by source: out-edges of every source, destinations ascending.
std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose_cuda(const at::Tensor& indptr, const at::Tensor& indices,
                                                                  int64_t num_src) {
  constexpr const char* op = "morphpipe::csr_transpose";
  check_csr_transpose(indptr, indices, num_src, op);
  const c10::cuda::CUDAGuard guard(indptr.device());
  const int64_t rows = indptr.numel() - 1, nnz = indices.numel();
  auto dst = at::empty({nnz}, indices.options());
  if (rows > 0) {
    const at::Tensor status = new_status(indptr.device());
    edge_rows_kernel<<<blocks_for(rows, 1), kThreadsPerBlock, 0, current_stream()>>>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), rows, nnz, num_src, dst.data_ptr<int64_t>(),
        status.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    check_structure_status(status, op, {rows, nnz, num_src});
  }
  auto [sorted, t_eid] = at::sort(indices, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  auto t_indptr = at::searchsorted(sorted, at::arange(num_src + 1, indices.options()));
  return {t_indptr, dst.index_select(0, t_eid), t_eid};
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CUDA, m) {
  m.impl("spmm_sum", &spmm_sum_cuda);
  m.impl("spmm_sum_scatter", &spmm_sum_scatter_cuda);
  m.impl("spmm_max", &spmm_max_cuda);
  m.impl("spmm_max_backward", &spmm_max_backward_cuda);
  m.impl("sddmm", &sddmm_cuda);
  m.impl("csr_transpose", &csr_transpose_cuda);
}

}  // namespace morphpipe::cuda
