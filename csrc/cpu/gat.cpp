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

namespace morphpipe {

namespace {

template <typename acc_t>
inline acc_t leaky(acc_t raw, acc_t slope) {
  return raw > acc_t(0) ? raw : raw * slope;
}

// d leaky(raw) / d raw.
template <typename acc_t>
inline acc_t leaky_grad(acc_t raw, acc_t slope) {
  return raw > acc_t(0) ? acc_t(1) : slope;
}

// Attention weight of an edge with score `raw`: softmax over the destination's edges, from its max and 1/sum.
template <typename acc_t>
inline acc_t attention(acc_t raw, acc_t slope, acc_t peak, acc_t inv) {
  return std::exp(leaky(raw, slope) - peak) * inv;
}

template <typename scalar_t>
void gat_forward_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* h, const acc_type<scalar_t>* ss,
                        const acc_type<scalar_t>* sd, acc_type<scalar_t> slope, bool self_loop, const GatShape& s,
                        const int64_t* order, scalar_t* out, acc_type<scalar_t>* row_max, acc_type<scalar_t>* row_sum) {
  using acc_t = acc_type<scalar_t>;
  const int64_t H = s.heads, F = s.F, hh = s.h_heads;
  const int64_t h_row = hh * F;
  const int64_t nnz = ptr[s.num_dst];
  for_each_row(s.num_dst, (nnz + s.num_dst) * H * F, [&](int64_t i) {
    acc_t buf[kFeatureTile];
    const int64_t beg = ptr[i], end = ptr[i + 1];
    for (int64_t k = 0; k < H; ++k) {
      const int64_t hk = hh == 1 ? 0 : k;
      const acc_t sdk = sd[i * H + k];
      acc_t peak = -std::numeric_limits<acc_t>::infinity();
      if (self_loop) peak = leaky(ss[i * H + k] + sdk, slope);
      for (int64_t e = beg; e < end; ++e) peak = std::max(peak, leaky(ss[idx[e] * H + k] + sdk, slope));
      acc_t total = 0;
      if (self_loop) total += std::exp(leaky(ss[i * H + k] + sdk, slope) - peak);
      for (int64_t e = beg; e < end; ++e) total += std::exp(leaky(ss[idx[e] * H + k] + sdk, slope) - peak);
      row_max[i * H + k] = peak;
      row_sum[i * H + k] = total;
      scalar_t* o = out + (i * H + k) * F;
      if (total == acc_t(0)) {
        std::fill(o, o + F, scalar_t(0));
        continue;
      }
      const acc_t inv = acc_t(1) / total;
      for (int64_t f0 = 0; f0 < F; f0 += kFeatureTile) {
        const int64_t n = std::min(kFeatureTile, F - f0);
        std::fill(buf, buf + n, acc_t(0));
        if (self_loop) {
          const acc_t a = attention(ss[i * H + k] + sdk, slope, peak, inv);
          axpy(buf, h + i * h_row + hk * F + f0, a, n);
        }
        for (int64_t e = beg; e < end; ++e) {
          if (e + kPrefetchEdges < nnz) prefetch_row(h + idx[e + kPrefetchEdges] * h_row + hk * F + f0, n);
          const int64_t j = idx[e];
          const acc_t a = attention(ss[j * H + k] + sdk, slope, peak, inv);
          axpy(buf, h + j * h_row + hk * F + f0, a, n);
        }
        for (int64_t f = 0; f < n; ++f) o[f0 + f] = static_cast<scalar_t>(buf[f]);
      }
    }
  }, order);
}

// Per destination and head: alpha and d(raw score) of every in-edge and the self loop, and the
// destination's score gradient. d raw_e = alpha_e (dalpha_e - sum_e' alpha_e' dalpha_e') leaky'(raw_e).
template <typename scalar_t>
void gat_backward_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* h, const acc_type<scalar_t>* ss,
                         const acc_type<scalar_t>* sd, const acc_type<scalar_t>* row_max,
                         const acc_type<scalar_t>* row_sum, const scalar_t* g, acc_type<scalar_t> slope,
                         bool self_loop, const GatShape& s, const int64_t* order, acc_type<scalar_t>* alpha,
                         acc_type<scalar_t>* alpha_self,
                         acc_type<scalar_t>* grad_edge, acc_type<scalar_t>* grad_self,
                         acc_type<scalar_t>* grad_dst) {
  using acc_t = acc_type<scalar_t>;
  const int64_t H = s.heads, F = s.F, hh = s.h_heads;
  const int64_t h_row = hh * F;
  const int64_t nnz = ptr[s.num_dst];
  auto dot = [F](const scalar_t* a, const scalar_t* b) {
    acc_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t f = 0; f < F; ++f) sum += static_cast<acc_t>(a[f]) * static_cast<acc_t>(b[f]);
    return sum;
  };
  for_each_row(s.num_dst, (nnz + s.num_dst) * H * F, [&](int64_t i) {
    const int64_t beg = ptr[i], end = ptr[i + 1];
    for (int64_t k = 0; k < H; ++k) {
      const int64_t hk = hh == 1 ? 0 : k;
      const acc_t sdk = sd[i * H + k], peak = row_max[i * H + k], total = row_sum[i * H + k];
      if (self_loop) alpha_self[i * H + k] = grad_self[i * H + k] = 0;
      grad_dst[i * H + k] = 0;
      if (total == acc_t(0)) continue;
      const acc_t inv = acc_t(1) / total;
      const scalar_t* gi = g + (i * H + k) * F;
      acc_t expected = 0;  // sum_e alpha_e dalpha_e = dot(g_i, out_i)
      acc_t a_self = 0, da_self = 0;
      if (self_loop) {
        a_self = attention(ss[i * H + k] + sdk, slope, peak, inv);
        da_self = dot(gi, h + i * h_row + hk * F);
        expected += a_self * da_self;
      }
      for (int64_t e = beg; e < end; ++e) {
        if (e + kPrefetchEdges < nnz) prefetch_row(h + idx[e + kPrefetchEdges] * h_row + hk * F, F);
        const int64_t j = idx[e];
        const acc_t a = attention(ss[j * H + k] + sdk, slope, peak, inv);
        const acc_t da = dot(gi, h + j * h_row + hk * F);
        alpha[e * H + k] = a;
        grad_edge[e * H + k] = da;
        expected += a * da;
      }
      acc_t dst_total = 0;
      if (self_loop) {
        const acc_t raw = ss[i * H + k] + sdk;
        const acc_t d = a_self * (da_self - expected) * leaky_grad(raw, slope);
        alpha_self[i * H + k] = a_self;
        grad_self[i * H + k] = d;
        dst_total += d;
      }
      for (int64_t e = beg; e < end; ++e) {
        const acc_t raw = ss[idx[e] * H + k] + sdk;
        const acc_t d = alpha[e * H + k] * (grad_edge[e * H + k] - expected) * leaky_grad(raw, slope);
        grad_edge[e * H + k] = d;
        dst_total += d;
      }
      grad_dst[i * H + k] = dst_total;
    }
  }, order);
}

// grad_h[j, hk] = sum over out-edges (i, e) of j of alpha[e, k] g[i, k] (+ the self loop), on the
// transposed structure: atomic-free, one source per iteration. Shared features sum all heads.
template <typename scalar_t>
void gat_grad_h_kernel(const int64_t* tptr, const int64_t* tdst, const int64_t* teid, const acc_type<scalar_t>* alpha,
                       const acc_type<scalar_t>* alpha_self, const scalar_t* g, int64_t num_src, int64_t num_dst,
                       int64_t H, int64_t hh, int64_t F, scalar_t* out) {
  using acc_t = acc_type<scalar_t>;
  const int64_t nnz = tptr[num_src];
  for_each_row(num_src, (nnz + num_src) * H * F, [&](int64_t j) {
    acc_t buf[kFeatureTile];
    for (int64_t hk = 0; hk < hh; ++hk) {
      const int64_t k_begin = hh == 1 ? 0 : hk, k_end = hh == 1 ? H : hk + 1;
      for (int64_t f0 = 0; f0 < F; f0 += kFeatureTile) {
        const int64_t n = std::min(kFeatureTile, F - f0);
        std::fill(buf, buf + n, acc_t(0));
        for (int64_t k = k_begin; k < k_end; ++k) {
          if (alpha_self && j < num_dst) axpy(buf, g + (j * H + k) * F + f0, alpha_self[j * H + k], n);
          for (int64_t t = tptr[j]; t < tptr[j + 1]; ++t) {
            if (t + kPrefetchEdges < nnz) prefetch_row(g + (tdst[t + kPrefetchEdges] * H + k) * F + f0, n);
            axpy(buf, g + (tdst[t] * H + k) * F + f0, alpha[teid[t] * H + k], n);
          }
        }
        scalar_t* o = out + (j * hh + hk) * F + f0;
        for (int64_t f = 0; f < n; ++f) o[f] = static_cast<scalar_t>(buf[f]);
      }
    }
  });
}

// The same gradient scattered from each destination with atomic adds (no transpose needed).
template <typename scalar_t>
void gat_grad_h_scatter_kernel(const int64_t* ptr, const int64_t* idx, const acc_type<scalar_t>* alpha,
                               const acc_type<scalar_t>* alpha_self, const scalar_t* g, int64_t num_dst, int64_t H,
                               int64_t hh, int64_t F, acc_type<scalar_t>* out) {
  for_each_row(num_dst, (ptr[num_dst] + num_dst) * H * F, [&](int64_t i) {
    for (int64_t k = 0; k < H; ++k) {
      const int64_t hk = hh == 1 ? 0 : k;
      const scalar_t* gi = g + (i * H + k) * F;
      if (alpha_self) atomic_axpy(out + (i * hh + hk) * F, gi, alpha_self[i * H + k], F);
      for (int64_t e = ptr[i]; e < ptr[i + 1]; ++e) atomic_axpy(out + (idx[e] * hh + hk) * F, gi, alpha[e * H + k], F);
    }
  });
}

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
    gat_forward_kernel<scalar_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), h.data_ptr<scalar_t>(),
                                 score_src.data_ptr<acc_t>(), score_dst.data_ptr<acc_t>(),
                                 static_cast<acc_t>(negative_slope), self_loop, s, order, out.data_ptr<scalar_t>(),
                                 row_max.data_ptr<acc_t>(), row_sum.data_ptr<acc_t>());
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
    gat_backward_kernel<scalar_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), h.data_ptr<scalar_t>(),
                                  score_src.data_ptr<acc_t>(), score_dst.data_ptr<acc_t>(), row_max.data_ptr<acc_t>(),
                                  row_sum.data_ptr<acc_t>(), grad_out.data_ptr<scalar_t>(),
                                  static_cast<acc_t>(negative_slope), self_loop, s, order, alpha.data_ptr<acc_t>(),
                                  alpha_self.data_ptr<acc_t>(), grad_edge.data_ptr<acc_t>(),
                                  grad_self.data_ptr<acc_t>(), grad_dst.data_ptr<acc_t>());
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
    gat_grad_h_kernel<scalar_t>(t_indptr.data_ptr<int64_t>(), t_dst.data_ptr<int64_t>(), t_eid.data_ptr<int64_t>(),
                                alpha.data_ptr<acc_t>(), alpha_self.numel() ? alpha_self.data_ptr<acc_t>() : nullptr,
                                grad_out.data_ptr<scalar_t>(), num_src, num_dst, H, h_heads, F,
                                out.data_ptr<scalar_t>());
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
    gat_grad_h_scatter_kernel<scalar_t>(indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(),
                                        alpha.data_ptr<acc_t>(),
                                        alpha_self.numel() ? alpha_self.data_ptr<acc_t>() : nullptr,
                                        grad_out.data_ptr<scalar_t>(), num_dst, H, h_heads, F, out.data_ptr<acc_t>());
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
