// The fused multi-head GAT kernels (forward, backward, the two forms of grad_h), compiled once per CPU
// capability by for_each_capability.h inside that level's namespace: no include guard and no includes
// (gat.cpp includes what they use first).

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

// Per-thread scratch of at least `n` values, kept between rows (a destination's edge scalars and head buffers).
template <typename acc_t>
inline acc_t* scratch(int64_t n) {
  thread_local std::vector<acc_t> values;
  if (static_cast<int64_t>(values.size()) < n) values.resize(n);
  return values.data();
}

// Per destination: each head's softmax over the in-edges (leaky ReLU and exp once per edge and head, kept in
// scratch), then the weighted sum with the edges outer and the heads inner, so a source row shared by every head
// (h_heads == 1) is read once for all of them. Each head's sums run in the same order as one head at a time.
template <typename scalar_t>
void gat_forward_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* h, const acc_type<scalar_t>* ss,
                        const acc_type<scalar_t>* sd, acc_type<scalar_t> slope, bool self_loop, const GatShape& s,
                        const int64_t* order, scalar_t* out, acc_type<scalar_t>* row_max, acc_type<scalar_t>* row_sum) {
  using acc_t = acc_type<scalar_t>;
  const int64_t H = s.heads, F = s.F, hh = s.h_heads;
  const int64_t h_row = hh * F;
  const int64_t nnz = ptr[s.num_dst];
  const int64_t tile = std::min(kFeatureTile, F);
  for_each_row(s.num_dst, (nnz + s.num_dst) * H * F, [&](int64_t i) {
    const int64_t beg = ptr[i], end = ptr[i + 1];
    // ex[(e - beg) * H + k]: exp(leaky(raw) - peak); then coef[k] = 1 / total (0 for an empty softmax), self_a[k]
    // the self loop's weight, buf[k * tile + f] the head's accumulator.
    acc_t* ex = scratch<acc_t>((end - beg) * H + 2 * H + H * tile);
    acc_t* coef = ex + (end - beg) * H;
    acc_t* self_a = coef + H;
    acc_t* buf = self_a + H;
    for (int64_t k = 0; k < H; ++k) {
      const acc_t sdk = sd[i * H + k];
      acc_t peak = -std::numeric_limits<acc_t>::infinity();
      if (self_loop) peak = leaky(ss[i * H + k] + sdk, slope);
      for (int64_t e = beg; e < end; ++e) {
        const acc_t l = leaky(ss[idx[e] * H + k] + sdk, slope);
        ex[(e - beg) * H + k] = l;
        peak = std::max(peak, l);
      }
      acc_t total = 0, self_ex = 0;
      if (self_loop) {
        self_ex = std::exp(leaky(ss[i * H + k] + sdk, slope) - peak);
        total += self_ex;
      }
      for (int64_t e = beg; e < end; ++e) {
        const acc_t v = std::exp(ex[(e - beg) * H + k] - peak);
        ex[(e - beg) * H + k] = v;
        total += v;
      }
      row_max[i * H + k] = peak;
      row_sum[i * H + k] = total;
      coef[k] = total == acc_t(0) ? acc_t(0) : acc_t(1) / total;
      self_a[k] = self_ex * coef[k];
    }
    for (int64_t f0 = 0; f0 < F; f0 += kFeatureTile) {
      const int64_t n = std::min(kFeatureTile, F - f0);
      std::fill(buf, buf + H * n, acc_t(0));
      if (self_loop) {
        for (int64_t k = 0; k < H; ++k) axpy(buf + k * n, h + i * h_row + (hh == 1 ? 0 : k) * F + f0, self_a[k], n);
      }
      for (int64_t e = beg; e < end; ++e) {
        if (e + kPrefetchEdges < nnz) prefetch_row(h + idx[e + kPrefetchEdges] * h_row + f0, hh == 1 ? n : h_row);
        const scalar_t* hj = h + idx[e] * h_row + f0;
        const acc_t* a = ex + (e - beg) * H;
        for (int64_t k = 0; k < H; ++k) axpy(buf + k * n, hj + (hh == 1 ? 0 : k) * F, a[k] * coef[k], n);
      }
      for (int64_t k = 0; k < H; ++k) {
        scalar_t* o = out + (i * H + k) * F + f0;
        const acc_t* b = buf + k * n;
        if (coef[k] == acc_t(0)) {
          std::fill(o, o + n, scalar_t(0));
        } else {
          for (int64_t f = 0; f < n; ++f) o[f] = static_cast<scalar_t>(b[f]);
        }
      }
    }
  }, order);
}

// Per destination and head: alpha and d(raw score) of every in-edge and the self loop, and the
// destination's score gradient. d raw_e = alpha_e (dalpha_e - sum_e' alpha_e' dalpha_e') leaky'(raw_e).
// The edges run outer and the heads inner, so a source row shared by every head is read once for all of them.
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
    // Per head: coef = 1 / total (0: an empty softmax, nothing flows), expected = sum_e alpha_e dalpha_e.
    acc_t* coef = scratch<acc_t>(4 * H);
    acc_t* expected = coef + H;
    acc_t* a_self = expected + H;
    acc_t* da_self = a_self + H;
    const scalar_t* gi = g + i * H * F;
    for (int64_t k = 0; k < H; ++k) {
      if (self_loop) alpha_self[i * H + k] = grad_self[i * H + k] = 0;
      grad_dst[i * H + k] = 0;
      const acc_t total = row_sum[i * H + k];
      coef[k] = total == acc_t(0) ? acc_t(0) : acc_t(1) / total;
      expected[k] = a_self[k] = da_self[k] = 0;
      if (self_loop && total != acc_t(0)) {
        a_self[k] = attention(ss[i * H + k] + sd[i * H + k], slope, row_max[i * H + k], coef[k]);
        da_self[k] = dot(gi + k * F, h + i * h_row + (hh == 1 ? 0 : k) * F);
        expected[k] += a_self[k] * da_self[k];
      }
    }
    for (int64_t e = beg; e < end; ++e) {
      if (e + kPrefetchEdges < nnz) prefetch_row(h + idx[e + kPrefetchEdges] * h_row, h_row);
      const int64_t j = idx[e];
      for (int64_t k = 0; k < H; ++k) {
        if (row_sum[i * H + k] == acc_t(0)) continue;
        const acc_t a = attention(ss[j * H + k] + sd[i * H + k], slope, row_max[i * H + k], coef[k]);
        const acc_t da = dot(gi + k * F, h + j * h_row + (hh == 1 ? 0 : k) * F);
        alpha[e * H + k] = a;
        grad_edge[e * H + k] = da;
        expected[k] += a * da;
      }
    }
    for (int64_t k = 0; k < H; ++k) {
      if (row_sum[i * H + k] == acc_t(0)) continue;
      const acc_t sdk = sd[i * H + k];
      acc_t dst_total = 0;
      if (self_loop) {
        const acc_t raw = ss[i * H + k] + sdk;
        const acc_t d = a_self[k] * (da_self[k] - expected[k]) * leaky_grad(raw, slope);
        alpha_self[i * H + k] = a_self[k];
        grad_self[i * H + k] = d;
        dst_total += d;
      }
      for (int64_t e = beg; e < end; ++e) {
        const acc_t raw = ss[idx[e] * H + k] + sdk;
        const acc_t d = alpha[e * H + k] * (grad_edge[e * H + k] - expected[k]) * leaky_grad(raw, slope);
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
