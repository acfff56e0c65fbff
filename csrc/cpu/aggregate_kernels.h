// The fused aggregation kernels (weighted sums, max with argmax, their backward passes, per-edge dot
// products), compiled once per CPU capability by for_each_capability.h inside that level's namespace: no
// include guard and no includes (aggregate.cpp includes what they use first).

// Row i of spmm_sum, its F values written to out_row:
// dst_scale[i] * (sum_e w[e] src_scale[j] x[j] + self_loop * src_scale[i] x[i]).
template <typename scalar_t>
inline void spmm_sum_row(const int64_t* ptr, const int64_t* idx, const scalar_t* x, int64_t num_x, int64_t F,
                         const acc_type<scalar_t>* w, const acc_type<scalar_t>* ss, const acc_type<scalar_t>* ds,
                         bool self_loop, int64_t nnz, int64_t i, scalar_t* out_row) {
  using acc_t = acc_type<scalar_t>;
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
    scalar_t* o = out_row + f0;
    for (int64_t f = 0; f < n; ++f) o[f] = narrow<scalar_t>(buf[f] * scale);
  }
}

// out[i] = dst_scale[i] * (sum_e w[e] src_scale[j] x[j] + self_loop * src_scale[i] x[i]).
template <typename scalar_t>
void spmm_sum_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* x, int64_t num_x, int64_t F,
                     const acc_type<scalar_t>* w, const acc_type<scalar_t>* ss, const acc_type<scalar_t>* ds,
                     bool self_loop, int64_t rows, const int64_t* order, scalar_t* out) {
  const int64_t nnz = ptr[rows];
  for_each_row(rows, (nnz + rows) * F, [&](int64_t i) {
    spmm_sum_row(ptr, idx, x, num_x, F, w, ss, ds, self_loop, nnz, i, out + i * F);
  }, order);
}

// spmm_sum with its output's projection in the same pass: out as spmm_sum, projected[i] = out[i] @ wt
// (wt = W^T, [F, O] row-major). Rows go in groups of kProjectRows (taken in `order` when given): each group is
// aggregated, then projected from its output rows while they are still in L1, kProjectRows accumulators of
// kProjectCols outputs sharing each load of wt, so the aggregate is never read back from memory. out null: the
// aggregate is not wanted (no weight gradient), each group's rows go to a per-thread scratch and are never written.
template <typename scalar_t>
void spmm_sum_project_kernel(const int64_t* ptr, const int64_t* idx, const scalar_t* x, int64_t num_x, int64_t F,
                             const acc_type<scalar_t>* w, const acc_type<scalar_t>* ss, const acc_type<scalar_t>* ds,
                             bool self_loop, int64_t rows, const int64_t* order, const scalar_t* wt, int64_t O,
                             scalar_t* out, scalar_t* projected) {
  const int64_t nnz = ptr[rows];
  const int64_t groups = (rows + kProjectRows - 1) / kProjectRows;
  for_each_row(groups, (nnz + rows) * F + rows * F * O, [&](int64_t g) {
    thread_local std::vector<scalar_t> scratch;
    if (!out && static_cast<int64_t>(scratch.size()) < kProjectRows * F) scratch.resize(kProjectRows * F);
    int64_t row[kProjectRows];
    const scalar_t* agg[kProjectRows];
    const int64_t count = std::min(kProjectRows, rows - g * kProjectRows);
    for (int64_t r = 0; r < count; ++r) {
      row[r] = order ? order[g * kProjectRows + r] : g * kProjectRows + r;
      scalar_t* dest = out ? out + row[r] * F : scratch.data() + r * F;
      spmm_sum_row(ptr, idx, x, num_x, F, w, ss, ds, self_loop, nnz, row[r], dest);
      agg[r] = dest;
    }
    for (int64_t o0 = 0; o0 < O; o0 += kProjectCols) {
      const int64_t n = std::min(kProjectCols, O - o0);
      scalar_t p[kProjectRows][kProjectCols] = {};
      if (count == kProjectRows && n == kProjectCols) {
        for (int64_t k = 0; k < F; ++k) {
          const scalar_t* wk = wt + k * O + o0;
          for (int64_t r = 0; r < kProjectRows; ++r) {
            const scalar_t a = agg[r][k];
#pragma omp simd
            for (int64_t c = 0; c < kProjectCols; ++c) p[r][c] += a * wk[c];
          }
        }
      } else {
        for (int64_t k = 0; k < F; ++k) {
          const scalar_t* wk = wt + k * O + o0;
          for (int64_t r = 0; r < count; ++r) {
            const scalar_t a = agg[r][k];
            for (int64_t c = 0; c < n; ++c) p[r][c] += a * wk[c];
          }
        }
      }
      for (int64_t r = 0; r < count; ++r) std::copy(p[r], p[r] + n, projected + row[r] * O + o0);
    }
  });
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
