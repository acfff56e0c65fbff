// Fused multi-head GAT on CUDA (Seastar): one thread group per destination; per head, the lanes
// split the in-edges to find the softmax max and sum (group shuffles), then split the features to
// accumulate the attention-weighted sum in registers. Forward keeps two scalars per destination
// and head; backward keeps per-edge scalars per head. `h` is [num_src, Hh, F], Hh == heads or 1
// (features shared by every head). Self loops follow the prefix convention.
#include <torch/library.h>

#include <limits>
#include <tuple>

#include "common/gat_checks.h"
#include "cuda/aggregate_common.cuh"

namespace morphpipe::cuda {

namespace {

template <typename acc_t>
__device__ __forceinline__ acc_t leaky(acc_t raw, acc_t slope) {
  return raw > acc_t(0) ? raw : raw * slope;
}

// d leaky(raw) / d raw.
template <typename acc_t>
__device__ __forceinline__ acc_t leaky_grad(acc_t raw, acc_t slope) {
  return raw > acc_t(0) ? acc_t(1) : slope;
}

// Attention weight of an edge with score `raw`: softmax over the destination's edges, from its max and 1/sum.
template <typename acc_t>
__device__ __forceinline__ acc_t attention(acc_t raw, acc_t slope, acc_t peak, acc_t inv) {
  return exp(leaky(raw, slope) - peak) * inv;
}

template <typename scalar_t, int G>
__global__ void gat_forward_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                                   const scalar_t* __restrict__ h, const acc_type<scalar_t>* __restrict__ ss,
                                   const acc_type<scalar_t>* __restrict__ sd, acc_type<scalar_t> slope, bool self_loop,
                                   GatShape s, const int64_t* __restrict__ order, scalar_t* __restrict__ out,
                                   acc_type<scalar_t>* __restrict__ row_max, acc_type<scalar_t>* __restrict__ row_sum,
                                   int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % G;
  int64_t i, begin, end;
  if (!this_group_row<G>(s.num_dst, order, indptr, s.nnz, status, i, begin, end)) return;
  const unsigned mask = group_mask<G>();
  const int64_t H = s.heads, F = s.F, h_row = s.h_heads * s.F;
  for (int64_t k = 0; k < H; ++k) {
    const int64_t hk = s.h_heads == 1 ? 0 : k;
    const acc_t sdk = sd[i * H + k];
    const acc_t self_score = self_loop ? leaky(ss[i * H + k] + sdk, slope) : acc_t(0);
    acc_t peak = (self_loop && lane == 0) ? self_score : -std::numeric_limits<acc_t>::infinity();
    for (int64_t e = begin + lane; e < end; e += G) {
      const int64_t j = indices[e];
      if (valid_index(j, s.num_src, status, kStatusIndexOutOfRange, e)) peak = max(peak, leaky(ss[j * H + k] + sdk, slope));
    }
    peak = group_max<G>(peak, mask);
    acc_t total = (self_loop && lane == 0) ? exp(self_score - peak) : acc_t(0);
    for (int64_t e = begin + lane; e < end; e += G) {
      const int64_t j = indices[e];
      if (valid_index(j, s.num_src, status, kStatusIndexOutOfRange, e)) total += exp(leaky(ss[j * H + k] + sdk, slope) - peak);
    }
    total = group_sum<G>(total, mask);
    if (lane == 0) {
      row_max[i * H + k] = peak;
      row_sum[i * H + k] = total;
    }
    scalar_t* o = out + (i * H + k) * F;
    if (total == acc_t(0)) {
      for (int64_t f = lane; f < F; f += G) o[f] = static_cast<scalar_t>(0);
      continue;
    }
    const acc_t inv = acc_t(1) / total;
    const acc_t self_alpha = self_loop ? exp(self_score - peak) * inv : acc_t(0);
    for (int64_t f = lane; f < F; f += G) {
      acc_t acc = self_loop ? self_alpha * static_cast<acc_t>(h[i * h_row + hk * F + f]) : acc_t(0);
      for (int64_t e = begin; e < end; ++e) {
        const int64_t j = indices[e];
        if (!valid_index(j, s.num_src, status, kStatusIndexOutOfRange, e)) continue;
        const acc_t a = attention(ss[j * H + k] + sdk, slope, peak, inv);
        acc += a * static_cast<acc_t>(h[j * h_row + hk * F + f]);
      }
      o[f] = static_cast<scalar_t>(acc);
    }
  }
}

template <typename scalar_t, int G>
__global__ void gat_backward_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                                    const scalar_t* __restrict__ h, const acc_type<scalar_t>* __restrict__ ss,
                                    const acc_type<scalar_t>* __restrict__ sd,
                                    const acc_type<scalar_t>* __restrict__ row_max,
                                    const acc_type<scalar_t>* __restrict__ row_sum, const scalar_t* __restrict__ g,
                                    acc_type<scalar_t> slope, bool self_loop, GatShape s,
                                    const int64_t* __restrict__ order, acc_type<scalar_t>* __restrict__ alpha,
                                    acc_type<scalar_t>* __restrict__ alpha_self,
                                    acc_type<scalar_t>* __restrict__ grad_edge,
                                    acc_type<scalar_t>* __restrict__ grad_self,
                                    acc_type<scalar_t>* __restrict__ grad_dst, int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % G;
  int64_t i, begin, end;
  if (!this_group_row<G>(s.num_dst, order, indptr, s.nnz, status, i, begin, end)) return;
  const unsigned mask = group_mask<G>();
  const int64_t H = s.heads, F = s.F, h_row = s.h_heads * s.F;
  for (int64_t k = 0; k < H; ++k) {
    const int64_t hk = s.h_heads == 1 ? 0 : k;
    const acc_t sdk = sd[i * H + k], peak = row_max[i * H + k], total = row_sum[i * H + k];
    if (lane == 0) {
      grad_dst[i * H + k] = 0;
      if (self_loop) alpha_self[i * H + k] = grad_self[i * H + k] = 0;
    }
    if (total == acc_t(0)) continue;
    const acc_t inv = acc_t(1) / total;
    const scalar_t* gi = g + (i * H + k) * F;
    acc_t expected = 0;  // sum_e alpha_e dalpha_e = dot(g_i, out_i)
    acc_t a_self = 0, da_self = 0;
    if (self_loop) {
      a_self = attention(ss[i * H + k] + sdk, slope, peak, inv);
      acc_t part = 0;
      for (int64_t f = lane; f < F; f += G)
        part += static_cast<acc_t>(gi[f]) * static_cast<acc_t>(h[i * h_row + hk * F + f]);
      da_self = group_sum<G>(part, mask);
      expected += a_self * da_self;
    }
    for (int64_t e = begin; e < end; ++e) {
      const int64_t j = indices[e];
      const bool ok = valid_index(j, s.num_src, status, kStatusIndexOutOfRange, e);
      const acc_t a = ok ? attention(ss[j * H + k] + sdk, slope, peak, inv) : acc_t(0);
      acc_t part = 0;
      if (ok) {
        for (int64_t f = lane; f < F; f += G)
          part += static_cast<acc_t>(gi[f]) * static_cast<acc_t>(h[j * h_row + hk * F + f]);
      }
      const acc_t da = group_sum<G>(part, mask);
      if (lane == 0) {
        alpha[e * H + k] = a;
        grad_edge[e * H + k] = da;
      }
      expected += a * da;
    }
    __syncwarp(mask);  // lane 0's per-edge writes are read by every lane below
    acc_t dst_total = 0;
    if (self_loop && lane == 0) {
      const acc_t raw = ss[i * H + k] + sdk;
      const acc_t d = a_self * (da_self - expected) * leaky_grad(raw, slope);
      alpha_self[i * H + k] = a_self;
      grad_self[i * H + k] = d;
      dst_total += d;
    }
    for (int64_t e = begin + lane; e < end; e += G) {
      const int64_t j = indices[e];
      const acc_t raw = valid_index(j, s.num_src, status, kStatusIndexOutOfRange, e) ? ss[j * H + k] + sdk : acc_t(0);
      const acc_t d = alpha[e * H + k] * (grad_edge[e * H + k] - expected) * leaky_grad(raw, slope);
      grad_edge[e * H + k] = d;
      dst_total += d;
    }
    dst_total = group_sum<G>(dst_total, mask);
    if (lane == 0) grad_dst[i * H + k] = dst_total;
  }
}

// grad_h on the transposed structure: one group per source, atomic-free.
template <typename scalar_t, int G>
__global__ void gat_grad_h_kernel(const int64_t* __restrict__ tptr, const int64_t* __restrict__ tdst,
                                  const int64_t* __restrict__ teid, const acc_type<scalar_t>* __restrict__ alpha,
                                  const acc_type<scalar_t>* __restrict__ alpha_self, const scalar_t* __restrict__ g,
                                  int64_t num_src, int64_t num_dst, int64_t H, int64_t hh, int64_t F, int64_t nnz,
                                  scalar_t* __restrict__ out, int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % G;
  int64_t j, begin, end;
  if (!this_group_row<G>(num_src, nullptr, tptr, nnz, status, j, begin, end)) return;
  for (int64_t hk = 0; hk < hh; ++hk) {
    const int64_t k_begin = hh == 1 ? 0 : hk, k_end = hh == 1 ? H : hk + 1;
    for (int64_t f = lane; f < F; f += G) {
      acc_t acc = 0;
      for (int64_t k = k_begin; k < k_end; ++k) {
        if (alpha_self && j < num_dst) acc += alpha_self[j * H + k] * static_cast<acc_t>(g[(j * H + k) * F + f]);
        for (int64_t t = begin; t < end; ++t) {
          const int64_t i = tdst[t], e = teid[t];
          if (!valid_index(i, num_dst, status, kStatusIndexOutOfRange, t) ||
              !valid_index(e, nnz, status, kStatusEdgeOutOfRange, t))
            continue;
          acc += alpha[e * H + k] * static_cast<acc_t>(g[(i * H + k) * F + f]);
        }
      }
      out[(j * hh + hk) * F + f] = static_cast<scalar_t>(acc);
    }
  }
}

// grad_h scattered from each destination with atomic adds (no transpose needed).
template <typename scalar_t, int G>
__global__ void gat_grad_h_scatter_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                                          const acc_type<scalar_t>* __restrict__ alpha,
                                          const acc_type<scalar_t>* __restrict__ alpha_self,
                                          const scalar_t* __restrict__ g, int64_t num_src, int64_t num_dst, int64_t H,
                                          int64_t hh, int64_t F, int64_t nnz, acc_type<scalar_t>* __restrict__ out,
                                          int64_t* status) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % G;
  int64_t i, begin, end;
  if (!this_group_row<G>(num_dst, nullptr, indptr, nnz, status, i, begin, end)) return;
  for (int64_t k = 0; k < H; ++k) {
    const int64_t hk = hh == 1 ? 0 : k;
    for (int64_t f = lane; f < F; f += G) {
      const acc_t gv = static_cast<acc_t>(g[(i * H + k) * F + f]);
      if (alpha_self) atomicAdd(out + (i * hh + hk) * F + f, alpha_self[i * H + k] * gv);
      for (int64_t e = begin; e < end; ++e) {
        const int64_t j = indices[e];
        if (!valid_index(j, num_src, status, kStatusIndexOutOfRange, e)) continue;
        atomicAdd(out + (j * hh + hk) * F + f, alpha[e * H + k] * gv);
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cuda(const at::Tensor& indptr, const at::Tensor& indices,
                                                                const at::Tensor& h, const at::Tensor& score_src,
                                                                const at::Tensor& score_dst, double negative_slope,
                                                                bool self_loop,
                                                                const std::optional<at::Tensor>& row_order) {
  constexpr const char* op = "morphpipe::gat_forward";
  const GatShape s = check_gat(indptr, indices, h, score_src, score_dst, self_loop, row_order, op);
  const c10::cuda::CUDAGuard guard(indptr.device());
  auto out = at::empty({s.num_dst, s.heads, s.F}, h.options());
  auto stat_options = h.options().dtype(accumulate_dtype(h));
  auto row_max = at::empty({s.num_dst, s.heads}, stat_options);
  auto row_sum = at::empty({s.num_dst, s.heads}, stat_options);
  if (s.num_dst == 0 || s.heads == 0) return {out, row_max, row_sum};
  const int64_t* order = optional_data<int64_t>(row_order);
  const at::Tensor status = new_status(indptr.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "gat_forward_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    with_group_size(group_size(s.F), [&](auto g) {
      constexpr int G = decltype(g)::value;
      gat_forward_kernel<scalar_t, G><<<blocks_for(s.num_dst, G), kThreadsPerBlock, 0,
                                        current_stream()>>>(
          indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), h.data_ptr<scalar_t>(), score_src.data_ptr<acc_t>(),
          score_dst.data_ptr<acc_t>(), static_cast<acc_t>(negative_slope), self_loop, s, order,
          out.data_ptr<scalar_t>(), row_max.data_ptr<acc_t>(), row_sum.data_ptr<acc_t>(), status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  check_structure_status(status, op, {s.num_dst, s.nnz, s.num_src});
  return {out, row_max, row_sum};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gat_backward_cuda(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& h, const at::Tensor& score_src,
    const at::Tensor& score_dst, const at::Tensor& row_max, const at::Tensor& row_sum, const at::Tensor& grad_out,
    double negative_slope, bool self_loop, const std::optional<at::Tensor>& row_order) {
  constexpr const char* op = "morphpipe::gat_backward";
  const GatShape s = check_gat_backward(indptr, indices, h, score_src, score_dst, row_max, row_sum, grad_out,
                                        self_loop, row_order, op);
  const auto device = indptr.device();
  const c10::cuda::CUDAGuard guard(device);
  auto options = h.options().dtype(accumulate_dtype(h));
  auto alpha = at::zeros({s.nnz, s.heads}, options);
  auto grad_edge = at::zeros({s.nnz, s.heads}, options);
  auto alpha_self = at::zeros({self_loop ? s.num_dst : 0, s.heads}, options);
  auto grad_self = at::zeros({self_loop ? s.num_dst : 0, s.heads}, options);
  auto grad_dst = at::zeros({s.num_dst, s.heads}, options);
  if (s.num_dst == 0 || s.heads == 0) return {alpha, alpha_self, grad_edge, grad_self, grad_dst};
  const int64_t* order = optional_data<int64_t>(row_order);
  const at::Tensor status = new_status(device);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "gat_backward_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    with_group_size(group_size(s.F), [&](auto g) {
      constexpr int G = decltype(g)::value;
      gat_backward_kernel<scalar_t, G><<<blocks_for(s.num_dst, G), kThreadsPerBlock, 0,
                                         current_stream()>>>(
          indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), h.data_ptr<scalar_t>(), score_src.data_ptr<acc_t>(),
          score_dst.data_ptr<acc_t>(), row_max.data_ptr<acc_t>(), row_sum.data_ptr<acc_t>(),
          grad_out.data_ptr<scalar_t>(), static_cast<acc_t>(negative_slope), self_loop, s, order,
          alpha.data_ptr<acc_t>(), alpha_self.data_ptr<acc_t>(), grad_edge.data_ptr<acc_t>(),
          grad_self.data_ptr<acc_t>(), grad_dst.data_ptr<acc_t>(), status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  check_structure_status(status, op, {s.num_dst, s.nnz, s.num_src});
  return {alpha, alpha_self, grad_edge, grad_self, grad_dst};
}

at::Tensor gat_grad_h_cuda(const at::Tensor& t_indptr, const at::Tensor& t_dst, const at::Tensor& t_eid,
                           const at::Tensor& alpha, const at::Tensor& alpha_self, const at::Tensor& grad_out,
                           int64_t h_heads) {
  constexpr const char* op = "morphpipe::gat_grad_h";
  check_gat_grad_h(t_indptr, t_dst, t_eid, alpha, alpha_self, grad_out, h_heads, op);
  const auto device = t_indptr.device();
  const int64_t nnz = t_eid.numel(), H = grad_out.size(1), F = grad_out.size(2);
  const int64_t num_dst = grad_out.size(0), num_src = t_indptr.numel() - 1;
  const c10::cuda::CUDAGuard guard(device);
  auto out = at::zeros({num_src, h_heads, F}, grad_out.options());
  if (num_src == 0 || F == 0) return out;
  const at::Tensor status = new_status(device);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_out.scalar_type(), "gat_grad_h_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    with_group_size(group_size(F), [&](auto g) {
      constexpr int G = decltype(g)::value;
      gat_grad_h_kernel<scalar_t, G><<<blocks_for(num_src, G), kThreadsPerBlock, 0,
                                       current_stream()>>>(
          t_indptr.data_ptr<int64_t>(), t_dst.data_ptr<int64_t>(), t_eid.data_ptr<int64_t>(), alpha.data_ptr<acc_t>(),
          alpha_self.numel() ? alpha_self.data_ptr<acc_t>() : nullptr, grad_out.data_ptr<scalar_t>(), num_src,
          num_dst, H, h_heads, F, nnz, out.data_ptr<scalar_t>(), status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  // The transposed structure's "sources" are the destinations: t_dst entries lie in [0, num_dst).
  check_structure_status(status, op, {num_src, nnz, num_dst});
  return out;
}

at::Tensor gat_grad_h_scatter_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& alpha,
                                   const at::Tensor& alpha_self, const at::Tensor& grad_out, int64_t num_src,
                                   int64_t h_heads) {
  constexpr const char* op = "morphpipe::gat_grad_h_scatter";
  check_gat_grad_h_scatter(indptr, indices, alpha, alpha_self, grad_out, num_src, h_heads, op);
  const auto device = indptr.device();
  const int64_t nnz = indices.numel(), H = grad_out.size(1), F = grad_out.size(2);
  const int64_t num_dst = grad_out.size(0);
  const c10::cuda::CUDAGuard guard(device);
  const auto acc = accumulate_dtype(grad_out);
  auto out = at::zeros({num_src, h_heads, F}, grad_out.options().dtype(acc));
  if (num_dst == 0 || F == 0) return out.to(grad_out.scalar_type());
  const at::Tensor status = new_status(device);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_out.scalar_type(), "gat_grad_h_scatter_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    with_group_size(group_size(F), [&](auto g) {
      constexpr int G = decltype(g)::value;
      gat_grad_h_scatter_kernel<scalar_t, G><<<blocks_for(num_dst, G), kThreadsPerBlock, 0,
                                               current_stream()>>>(
          indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), alpha.data_ptr<acc_t>(),
          alpha_self.numel() ? alpha_self.data_ptr<acc_t>() : nullptr, grad_out.data_ptr<scalar_t>(), num_src,
          num_dst, H, h_heads, F, nnz, out.data_ptr<acc_t>(), status.data_ptr<int64_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  check_structure_status(status, op, {num_dst, nnz, num_src});
  return out.to(grad_out.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CUDA, m) {
  m.impl("gat_forward", &gat_forward_cuda);
  m.impl("gat_backward", &gat_backward_cuda);
  m.impl("gat_grad_h", &gat_grad_h_cuda);
  m.impl("gat_grad_h_scatter", &gat_grad_h_scatter_cuda);
}

}  // namespace morphpipe::cuda
