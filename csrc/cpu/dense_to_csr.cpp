// Op `morphpipe::dense_to_csr` (CPU only): the non-zeros of a dense feature matrix as CSR (Morphling's
// sparse first-layer path): one counting pass and one filling pass over the rows, both OpenMP-parallel.
#include <torch/library.h>

#include <tuple>

#include "common/tensor_checks.h"
#include "cpu/aggregate_common.h"

namespace morphpipe {

namespace {

template <typename scalar_t>
void dense_to_csr_kernel(const scalar_t* x, int64_t rows, int64_t cols, int64_t* indptr, int64_t* indices,
                         scalar_t* values) {
  for_each_row(rows, rows * cols, [&](int64_t i) {
    const scalar_t* row = x + i * cols;
    int64_t slot = indptr[i];
    for (int64_t c = 0; c < cols; ++c) {
      if (row[c] != scalar_t(0)) {
        indices[slot] = c;
        values[slot] = row[c];
        ++slot;
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> dense_to_csr_cpu(const at::Tensor& x) {
  constexpr const char* op = "morphpipe::dense_to_csr";
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [rows, cols], got shape ", x.sizes());
  check_on(x, at::kCPU, op, "x");
  const int64_t rows = x.size(0), cols = x.size(1);
  auto indptr = at::empty({rows + 1}, x.options().dtype(at::kLong));
  int64_t* ptr = indptr.data_ptr<int64_t>();
  ptr[0] = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dense_to_csr_count", [&] {
    const scalar_t* data = x.data_ptr<scalar_t>();
    for_each_row(rows, rows * cols, [&](int64_t i) {
      int64_t count = 0;
      for (int64_t c = 0; c < cols; ++c) count += data[i * cols + c] != scalar_t(0);
      ptr[i + 1] = count;
    });
  });
  for (int64_t i = 0; i < rows; ++i) ptr[i + 1] += ptr[i];
  auto indices = at::empty({ptr[rows]}, indptr.options());
  auto values = at::empty({ptr[rows]}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dense_to_csr_fill", [&] {
    dense_to_csr_kernel<scalar_t>(x.data_ptr<scalar_t>(), rows, cols, ptr, indices.data_ptr<int64_t>(),
                                  values.data_ptr<scalar_t>());
  });
  return {indptr, indices, values};
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) { m.impl("dense_to_csr", &dense_to_csr_cpu); }

}  // namespace morphpipe
