// The backward of ReLU + dropout followed by a mean aggregation (and the destinations' own rows), one pass per
// source row, compiled once per CPU capability by for_each_capability.h inside that level's namespace: no include
// guard and no includes (relu_mean.cpp includes what they use first).

// Rows [r0, r1) of grad_pre, each value computed exactly as the three passes it replaces round it: the transposed
// mean's sum t (spmm_sum's output), t + self_grad[j] for j < self_rows (PrefixSplit's add), then
// t * (out[j] > 0 ? keep_scale : 0) (bias_act_dropout_backward's ReLU); the narrowed results' column sums are
// added to `sums` [F] in row order.
template <typename scalar_t>
void relu_mean_backward_rows(const int64_t* ptr, const int64_t* dst, const scalar_t* grad,
                             const acc_type<scalar_t>* scale, const scalar_t* self_grad, int64_t self_rows,
                             const scalar_t* out, int64_t F, int64_t r0, int64_t r1, acc_type<scalar_t> keep_scale,
                             scalar_t* grad_pre, double* sums) {
  using acc_t = acc_type<scalar_t>;
  const int64_t nnz = ptr[r1];
  acc_t buf[kFeatureTile];
  for (int64_t j = r0; j < r1; ++j) {
    for (int64_t f0 = 0; f0 < F; f0 += kFeatureTile) {
      const int64_t n = std::min(kFeatureTile, F - f0);
      std::fill(buf, buf + n, acc_t(0));
      for (int64_t e = ptr[j]; e < ptr[j + 1]; ++e) {
        if (e + kPrefetchEdges < nnz) prefetch_row(grad + dst[e + kPrefetchEdges] * F + f0, n);
        const int64_t i = dst[e];
        axpy(buf, grad + i * F + f0, scale[i], n);
      }
      const scalar_t* __restrict__ o = out + j * F + f0;
      scalar_t* __restrict__ d = grad_pre + j * F + f0;
      double* __restrict__ s = sums + f0;
      if (j < self_rows) {
        const scalar_t* __restrict__ g = self_grad + j * F + f0;
#pragma omp simd
        for (int64_t f = 0; f < n; ++f) {
          const acc_t t = widen<acc_t>(narrow<scalar_t>(widen<acc_t>(narrow<scalar_t>(buf[f])) + widen<acc_t>(g[f])));
          const acc_t pass = widen<acc_t>(o[f]) > acc_t(0) ? keep_scale : acc_t(0);
          d[f] = narrow<scalar_t>(t * pass);
          s[f] += static_cast<double>(widen<acc_t>(d[f]));
        }
      } else {
#pragma omp simd
        for (int64_t f = 0; f < n; ++f) {
          const acc_t t = widen<acc_t>(narrow<scalar_t>(buf[f]));
          const acc_t pass = widen<acc_t>(o[f]) > acc_t(0) ? keep_scale : acc_t(0);
          d[f] = narrow<scalar_t>(t * pass);
          s[f] += static_cast<double>(widen<acc_t>(d[f]));
        }
      }
    }
  }
}

// Every row of grad_pre, in blocks of kSumRows rows taken dynamically by the threads; block b's column sums go to
// partial[b * F ...], so the caller's reduction in block order is the same for every thread count.
template <typename scalar_t>
void relu_mean_backward_kernel(const int64_t* ptr, const int64_t* dst, const scalar_t* grad,
                               const acc_type<scalar_t>* scale, const scalar_t* self_grad, int64_t self_rows,
                               const scalar_t* out, int64_t F, int64_t rows, acc_type<scalar_t> keep_scale,
                               scalar_t* grad_pre, double* partial) {
  const int64_t blocks = (rows + kSumRows - 1) / kSumRows;
  for_each_row(blocks, (ptr[rows] + rows) * F, [&](int64_t b) {
    relu_mean_backward_rows<scalar_t>(ptr, dst, grad, scale, self_grad, self_rows, out, F, b * kSumRows,
                                      std::min(rows, (b + 1) * kSumRows), keep_scale, grad_pre, partial + b * F);
  });
}
