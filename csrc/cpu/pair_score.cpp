// The fused pair scorer of link prediction's dot decoder: score[i] = <h[src[i]], h[dst[i]]> for a list of pairs
// over one embedding table, and its backward as a sum into h's rows, without the [pairs, width] tensors that
// gathering both endpoints' rows (and the gathers' backward) would make. The backward groups each row's
// contributions (a counting sort of the pairs by endpoint, in pair order) and sums them row by row: no atomics,
// and the result does not depend on the thread count.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/accumulate.h"
#include "common/pair_score_checks.h"

namespace morphpipe {

// Pairs ahead whose rows are prefetched (their rows are scattered over h), and the feature tile the backward
// sums in registers.
constexpr int64_t kPairPrefetch = 8;
constexpr int64_t kPairTile = 256;

}  // namespace morphpipe

#define MORPHPIPE_KERNELS "cpu/pair_score_kernels.h"
#include "cpu/for_each_capability.h"

namespace morphpipe {

namespace {

// Every entry of src and dst names a row of h.
void check_pair_indices(const at::Tensor& src, const at::Tensor& dst, int64_t rows, const char* op) {
  const int64_t* s = src.data_ptr<int64_t>();
  const int64_t* d = dst.data_ptr<int64_t>();
  for (int64_t i = 0; i < src.numel(); ++i) {
    if (s[i] < 0 || s[i] >= rows) check_pair_index("src", i, s[i], rows, op);
    if (d[i] < 0 || d[i] >= rows) check_pair_index("dst", i, d[i], rows, op);
  }
}

at::Tensor pair_dot_cpu(const at::Tensor& h, const at::Tensor& src, const at::Tensor& dst) {
  constexpr const char* op = "morphpipe::pair_dot";
  check_pair_dot(h, src, dst, op);
  check_pair_indices(src, dst, h.size(0), op);
  const int64_t pairs = src.numel(), width = h.size(1);
  auto out = at::empty({pairs}, h.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "pair_dot_cpu", [&] {
    const scalar_t* hp = h.data_ptr<scalar_t>();
    const int64_t* sp = src.data_ptr<int64_t>();
    const int64_t* dp = dst.data_ptr<int64_t>();
    scalar_t* outp = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1));
    at::parallel_for(0, pairs, grain, [&](int64_t begin, int64_t end) {
      MORPHPIPE_CPU_DISPATCH(isa::pair_dot_kernel<scalar_t>(hp, sp, dp, width, begin, end, outp));
    });
  });
  return out;
}

at::Tensor pair_dot_backward_cpu(const at::Tensor& h, const at::Tensor& src, const at::Tensor& dst,
                                 const at::Tensor& grad) {
  constexpr const char* op = "morphpipe::pair_dot_backward";
  check_pair_dot_backward(h, src, dst, grad, op);
  check_pair_indices(src, dst, h.size(0), op);
  const int64_t rows = h.size(0), width = h.size(1), pairs = src.numel();
  const int64_t* s = src.data_ptr<int64_t>();
  const int64_t* d = dst.data_ptr<int64_t>();
  // Each pair contributes to both of its endpoints' rows: grad[i] * h[dst[i]] to src[i]'s, grad[i] * h[src[i]] to
  // dst[i]'s (twice to one row when src[i] == dst[i], the derivative of <h_u, h_u>).
  std::vector<int64_t> ptr(static_cast<size_t>(rows) + 1, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    ++ptr[s[i] + 1];
    ++ptr[d[i] + 1];
  }
  for (int64_t r = 0; r < rows; ++r) ptr[r + 1] += ptr[r];
  std::vector<int64_t> fill(ptr.begin(), ptr.end() - 1), other(2 * pairs), pair(2 * pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t a = fill[s[i]]++;
    other[a] = d[i];
    pair[a] = i;
    const int64_t b = fill[d[i]]++;
    other[b] = s[i];
    pair[b] = i;
  }
  // Row ranges of about equal work (a row's entries plus its own write): sources of many pairs sit together.
  const int64_t teams = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  const int64_t total = ptr[rows] + rows;
  std::vector<int64_t> bounds(static_cast<size_t>(teams) + 1, rows);
  bounds[0] = 0;
  for (int64_t t = 1; t < teams; ++t) {
    int64_t lo = bounds[t - 1], hi = rows;  // first row r with ptr[r] + r >= t * total / teams
    const int64_t target = t * total / teams;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (ptr[mid] + mid < target) lo = mid + 1; else hi = mid;
    }
    bounds[t] = lo;
  }
  auto grad_h = at::empty_like(h);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "pair_dot_backward_cpu", [&] {
    const scalar_t* hp = h.data_ptr<scalar_t>();
    const scalar_t* gp = grad.data_ptr<scalar_t>();
    scalar_t* out = grad_h.data_ptr<scalar_t>();
    at::parallel_for(0, teams, 1, [&](int64_t first, int64_t last) {
      for (int64_t t = first; t < last; ++t) {
        MORPHPIPE_CPU_DISPATCH(isa::pair_dot_backward_kernel<scalar_t>(hp, gp, ptr.data(), other.data(), pair.data(),
                                                                       width, bounds[t], bounds[t + 1], out));
      }
    });
  });
  return grad_h;
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) {
  m.impl("pair_dot", &pair_dot_cpu);
  m.impl("pair_dot_backward", &pair_dot_backward_cpu);
}

}  // namespace morphpipe
