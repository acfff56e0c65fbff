// The backward of `mean(relu_dropout(x + bias))` with the destinations' own rows split off (a SAGE layer reading
// the previous layer's activations) as one pass per source row: the transposed mean's gradient, the own rows'
// gradient and the ReLU's derivative (from its saved output) meet in registers, and the bias gradient's column
// sums come from the same pass. It replaces spmm_sum over the transposed structure, an add over the own rows and
// bias_act_dropout_backward, three passes over the layer's [rows, F] activations, with identical values.
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "common/relu_mean_checks.h"
#include "cpu/aggregate_common.h"

namespace morphpipe {

// Rows per column-sum block: the bias gradient is summed per block, then the blocks in order (deterministic).
constexpr int64_t kSumRows = 256;

}  // namespace morphpipe

#define MORPHPIPE_KERNELS "cpu/relu_mean_kernels.h"
#include "cpu/for_each_capability.h"

namespace morphpipe {

namespace {

std::tuple<at::Tensor, at::Tensor> relu_mean_backward_cpu(const at::Tensor& t_indptr, const at::Tensor& t_dst,
                                                          const at::Tensor& grad, const at::Tensor& scale,
                                                          const std::optional<at::Tensor>& self_grad,
                                                          const at::Tensor& out, double p) {
  constexpr const char* op = "morphpipe::relu_mean_backward";
  check_relu_mean_backward(t_indptr, t_dst, grad, scale, self_grad, out, p, op);
  check_csr_values(t_indptr, t_dst, grad.size(0), op);
  const int64_t rows = t_indptr.numel() - 1, F = grad.size(1);
  const int64_t self_rows = present(self_grad) ? self_grad->size(0) : 0;
  auto grad_pre = at::empty({rows, F}, grad.options());
  auto grad_bias = at::empty({F}, grad.options());
  std::vector<double> partial(static_cast<size_t>((rows + kSumRows - 1) / kSumRows * F), 0.0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "relu_mean_backward_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    const acc_t keep_scale = static_cast<acc_t>(p > 0.0 ? 1.0 / (1.0 - p) : 1.0);
    MORPHPIPE_CPU_DISPATCH(isa::relu_mean_backward_kernel<scalar_t>(
        t_indptr.data_ptr<int64_t>(), t_dst.data_ptr<int64_t>(), grad.data_ptr<scalar_t>(), scale.data_ptr<acc_t>(),
        self_rows ? self_grad->data_ptr<scalar_t>() : nullptr, self_rows, out.data_ptr<scalar_t>(), F, rows,
        keep_scale, grad_pre.data_ptr<scalar_t>(), partial.data()));
    scalar_t* gb = grad_bias.data_ptr<scalar_t>();
    const int64_t blocks = (rows + kSumRows - 1) / kSumRows;
    for (int64_t c = 0; c < F; ++c) {
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; ++b) sum += partial[b * F + c];
      gb[c] = static_cast<scalar_t>(sum);
    }
  });
  return {grad_pre, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) { m.impl("relu_mean_backward", &relu_mean_backward_cpu); }

}  // namespace morphpipe
