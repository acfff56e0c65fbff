// Fused bias + activation + dropout on CUDA, drawing the same mask bits as the CPU kernel
// (common/dropout_mask.h): a warp covers 32 mask words (1024 elements); in step k lane l handles
// element 1024 * chunk + 32 * k + l (coalesced loads and stores) and the warp's ballot is word k.
// The backward is elementwise; the bias gradient is grad_x's column sum (torch's reduction,
// deterministic).
#include <torch/library.h>

#include <tuple>

#include "common/bias_act_dropout_checks.h"
#include "common/dropout_mask.h"
#include "cuda/aggregate_common.cuh"

namespace morphpipe::cuda {

namespace {

template <typename scalar_t>
__global__ void bias_act_dropout_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias,
                                        scalar_t* __restrict__ out, int32_t* __restrict__ mask, int64_t n,
                                        int64_t features, bool relu, uint64_t key, uint32_t threshold,
                                        acc_type<scalar_t> scale) {
  using acc_t = acc_type<scalar_t>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t chunks = (n + kWarp * kMaskWordBits - 1) / (kWarp * kMaskWordBits);
  for (int64_t chunk = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; chunk < chunks;
       chunk += warps) {
    for (int k = 0; k < kMaskWordBits; ++k) {
      const int64_t word = chunk * kWarp + k;
      const int64_t i = word * kMaskWordBits + lane;
      bool keep = false;
      if (i < n) {
        acc_t y = static_cast<acc_t>(x[i]) + (bias ? static_cast<acc_t>(bias[i % features]) : acc_t(0));
        if (relu && y < acc_t(0)) y = acc_t(0);  // NaN stays NaN, as in torch.relu
        keep = !mask || dropout_bits(key, i) < threshold;
        out[i] = static_cast<scalar_t>(keep ? y * scale : acc_t(0));
      }
      if (mask) {
        const unsigned bits = __ballot_sync(0xffffffffu, keep);
        if (lane == 0 && word * kMaskWordBits < n) mask[word] = static_cast<int32_t>(bits);
      }
    }
  }
}

template <typename scalar_t>
__global__ void bias_act_dropout_backward_kernel(const scalar_t* __restrict__ grad, const scalar_t* __restrict__ out,
                                                 const int32_t* __restrict__ mask, scalar_t* __restrict__ grad_x,
                                                 int64_t n, bool relu, acc_type<scalar_t> scale) {
  using acc_t = acc_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    bool pass = true;
    if (relu) {
      pass = static_cast<acc_t>(out[i]) > acc_t(0);
    } else if (mask) {
      pass = (static_cast<uint32_t>(mask[i >> 5]) >> (i & 31)) & 1u;
    }
    grad_x[i] = pass ? static_cast<scalar_t>(static_cast<acc_t>(grad[i]) * scale) : scalar_t(0);
  }
}

// Blocks for `threads` threads, capped (the kernels loop grid-stride).
inline unsigned capped_blocks(int64_t threads) {
  return static_cast<unsigned>(std::min<int64_t>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock, 65535));
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_cuda(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                                                         c10::string_view activation_name, double p, int64_t seed) {
  constexpr const char* op = "morphpipe::bias_act_dropout";
  check_bias_act_dropout(x, bias, p, op);
  const Activation activation = parse_activation(std::string(activation_name), op);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.numel(), features = std::max<int64_t>(x.size(1), 1);
  auto out = at::empty_like(x);
  auto mask = at::empty({p > 0.0 ? mask_words(n) : 0}, x.options().dtype(at::kInt));
  if (n == 0) return {out, mask};
  const int64_t chunks = (n + kWarp * kMaskWordBits - 1) / (kWarp * kMaskWordBits);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_act_dropout_cuda", [&] {
    using acc_t = acc_type<scalar_t>;
    bias_act_dropout_kernel<scalar_t><<<capped_blocks(chunks * kWarp), kThreadsPerBlock, 0, current_stream()>>>(
        x.data_ptr<scalar_t>(), bias.has_value() && bias->defined() ? bias->data_ptr<scalar_t>() : nullptr,
        out.data_ptr<scalar_t>(), p > 0.0 ? mask.data_ptr<int32_t>() : nullptr, n, features,
        activation == Activation::kRelu, dropout_key(seed), keep_threshold(p), static_cast<acc_t>(1.0 / (1.0 - p)));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out, mask};
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_backward_cuda(const at::Tensor& grad, const at::Tensor& out,
                                                                  const at::Tensor& mask,
                                                                  c10::string_view activation_name, double p,
                                                                  bool need_bias_grad) {
  constexpr const char* op = "morphpipe::bias_act_dropout_backward";
  const Activation activation = parse_activation(std::string(activation_name), op);
  const bool use_mask = check_bias_act_dropout_backward(grad, out, mask, activation, p, op);
  const int64_t n = out.numel();
  const c10::cuda::CUDAGuard guard(out.device());
  auto grad_x = at::empty_like(out);
  if (n > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "bias_act_dropout_backward_cuda", [&] {
      using acc_t = acc_type<scalar_t>;
      bias_act_dropout_backward_kernel<scalar_t><<<capped_blocks(n), kThreadsPerBlock, 0, current_stream()>>>(
          grad.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), use_mask ? mask.data_ptr<int32_t>() : nullptr,
          grad_x.data_ptr<scalar_t>(), n, activation == Activation::kRelu,
          static_cast<acc_t>(p > 0.0 ? 1.0 / (1.0 - p) : 1.0));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  auto grad_bias = need_bias_grad ? grad_x.sum(0) : at::empty({0}, out.options());
  return {grad_x, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CUDA, m) {
  m.impl("bias_act_dropout", &bias_act_dropout_cuda);
  m.impl("bias_act_dropout_backward", &bias_act_dropout_backward_cuda);
}

}  // namespace morphpipe::cuda
