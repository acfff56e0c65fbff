// The fused pair scorer's kernels (per-pair dot products, and the backward's per-row sums over a row's pairs),
// compiled once per CPU capability by for_each_capability.h inside that level's namespace: no include guard and
// no includes (pair_score.cpp includes what they use first).

// Issues prefetches for the cache lines of one row of `width` elements.
template <typename scalar_t>
inline void prefetch_pair_row(const scalar_t* row, int64_t width) {
  constexpr int64_t kPerLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t f = 0; f < width; f += kPerLine) __builtin_prefetch(row + f);
}

// out[i] = <h[src[i]], h[dst[i]]> for pairs [begin, end), summed in the accumulation dtype.
template <typename scalar_t>
void pair_dot_kernel(const scalar_t* h, const int64_t* src, const int64_t* dst, int64_t width, int64_t begin,
                     int64_t end, scalar_t* out) {
  using acc_t = acc_type<scalar_t>;
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPairPrefetch < end) {
      prefetch_pair_row(h + dst[i + kPairPrefetch] * width, width);
      prefetch_pair_row(h + src[i + kPairPrefetch] * width, width);
    }
    const scalar_t* __restrict__ a = h + src[i] * width;
    const scalar_t* __restrict__ b = h + dst[i] * width;
    acc_t dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t f = 0; f < width; ++f) dot += static_cast<acc_t>(a[f]) * static_cast<acc_t>(b[f]);
    out[i] = static_cast<scalar_t>(dot);
  }
}

// grad_h[r] = sum over the entries e of row r (ptr[r] .. ptr[r + 1], in pair order) of
// grad[pair[e]] * h[other[e]], for rows [begin, end); rows without entries get zeros.
template <typename scalar_t>
void pair_dot_backward_kernel(const scalar_t* h, const scalar_t* grad, const int64_t* ptr, const int64_t* other,
                              const int64_t* pair, int64_t width, int64_t begin, int64_t end, scalar_t* grad_h) {
  using acc_t = acc_type<scalar_t>;
  const int64_t last = ptr[end];
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t f0 = 0; f0 < width; f0 += kPairTile) {
      const int64_t n = std::min(kPairTile, width - f0);
      acc_t sum[kPairTile];
      std::fill(sum, sum + n, acc_t(0));
      for (int64_t e = ptr[r]; e < ptr[r + 1]; ++e) {
        if (f0 == 0 && e + kPairPrefetch < last) prefetch_pair_row(h + other[e + kPairPrefetch] * width, width);
        const scalar_t* __restrict__ row = h + other[e] * width + f0;
        const acc_t g = static_cast<acc_t>(grad[pair[e]]);
#pragma omp simd
        for (int64_t f = 0; f < n; ++f) sum[f] += g * static_cast<acc_t>(row[f]);
      }
      scalar_t* __restrict__ o = grad_h + r * width + f0;
#pragma omp simd
      for (int64_t f = 0; f < n; ++f) o[f] = static_cast<scalar_t>(sum[f]);
    }
  }
}
