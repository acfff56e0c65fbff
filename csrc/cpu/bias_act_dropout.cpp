// Fused bias + activation + dropout between GNN layers, forward and backward, in one pass over
// the activations each (instead of an add, a ReLU, a Bernoulli draw into a float mask and a
// multiply, each a full pass). The mask is drawn by a counter-based generator
// (common/dropout_mask.h), so any thread may draw any element's bit and the result does not depend
// on the thread count; it is kept as bits. The backward of ReLU reads its derivative from the
// output (out > 0 exactly where the element was kept and its input was positive), so ReLU's
// backward needs no mask read at all.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <omp.h>

#include <cstring>

#include "common/accumulate.h"
#include "common/bias_act_dropout_checks.h"
#include "common/dropout_mask.h"
#include "cpu/vector_convert.h"

namespace morphpipe {

// Elements per random-draw chunk: 32 mask words, whose uniforms stay in L1.
constexpr int64_t kDrawChunk = 32 * kMaskWordBits;

}  // namespace morphpipe

#define MORPHPIPE_KERNELS "cpu/bias_act_dropout_kernels.h"
#include "cpu/for_each_capability.h"

namespace morphpipe {

namespace {

// The calling thread's share [begin, end) of `count` items split evenly across the team.
inline std::pair<int64_t, int64_t> thread_range(int64_t count, int thread, int threads) {
  const int64_t per = count / threads, extra = count % threads;
  const int64_t begin = thread * per + std::min<int64_t>(thread, extra);
  return {begin, begin + per + (thread < extra ? 1 : 0)};
}

// Runs `body(thread, team_size)` on an OpenMP team of at most `threads` threads (inline when 1).
template <typename Body>
void run_team(int threads, const Body& body) {
#pragma omp parallel num_threads(threads) if (threads > 1)
  body(omp_get_thread_num(), omp_get_num_threads());
}

// Calls `body` with the compile-time activation, bias and dropout switches.
template <typename Body>
void with_forward_variant(Activation activation, bool has_bias, bool drop, const Body& body) {
  const auto with_drop = [&](auto act, auto bias) {
    if (drop) {
      body(act, bias, std::true_type{});
    } else {
      body(act, bias, std::false_type{});
    }
  };
  const auto with_bias = [&](auto act) {
    if (has_bias) {
      with_drop(act, std::true_type{});
    } else {
      with_drop(act, std::false_type{});
    }
  };
  if (activation == Activation::kRelu) {
    with_bias(std::integral_constant<Activation, Activation::kRelu>{});
  } else {
    with_bias(std::integral_constant<Activation, Activation::kIdentity>{});
  }
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_cpu(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                                                        c10::string_view activation_name, double p, int64_t seed) {
  constexpr const char* op = "morphpipe::bias_act_dropout";
  check_bias_act_dropout(x, bias, p, op);
  const Activation activation = parse_activation(std::string(activation_name), op);
  const int64_t n = x.numel(), features = std::max<int64_t>(x.size(1), 1);
  auto out = at::empty_like(x);
  auto mask = at::empty({p > 0.0 ? mask_words(n) : 0}, x.options().dtype(at::kInt));
  const uint64_t key = dropout_key(seed);
  const uint32_t threshold = keep_threshold(p);
  const double scale = 1.0 / (1.0 - p);
  const int threads = at::get_num_threads();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_act_dropout_cpu", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* bp = bias.has_value() && bias->defined() ? bias->data_ptr<scalar_t>() : nullptr;
    scalar_t* op_ = out.data_ptr<scalar_t>();
    int32_t* mp = p > 0.0 ? mask.data_ptr<int32_t>() : nullptr;
    const int64_t words = mask_words(n);
    with_forward_variant(activation, bp != nullptr, mp != nullptr, [&](auto act, auto has_bias, auto drop) {
      run_team(threads > 1 && n > 32768 ? threads : 1, [&](int thread, int size) {
        const auto [w0, w1] = thread_range(words, thread, size);
        MORPHPIPE_CPU_DISPATCH(
            isa::forward_range<scalar_t, decltype(act)::value, decltype(has_bias)::value, decltype(drop)::value>(
                xp, bp, op_, mp, features, w0 * kMaskWordBits, std::min(n, w1 * kMaskWordBits), key, threshold,
                scale));
      });
    });
  });
  return {out, mask};
}

std::tuple<at::Tensor, at::Tensor> bias_act_dropout_backward_cpu(const at::Tensor& grad, const at::Tensor& out,
                                                                 const at::Tensor& mask,
                                                                 c10::string_view activation_name, double p,
                                                                 bool need_bias_grad) {
  constexpr const char* op = "morphpipe::bias_act_dropout_backward";
  const Activation activation = parse_activation(std::string(activation_name), op);
  const bool use_mask = check_bias_act_dropout_backward(grad, out, mask, activation, p, op);
  const int64_t rows = out.size(0), features = out.size(1), n = out.numel();
  auto grad_x = at::empty_like(out);
  auto grad_bias = at::empty({need_bias_grad ? features : 0}, out.options());
  const int threads = at::get_num_threads();
  const int team = threads > 1 && n > 32768 ? threads : 1;
  // Per-thread column sums in double, reduced in thread order: the bias gradient is deterministic.
  std::vector<double> partial(need_bias_grad ? static_cast<size_t>(team * features) : 0, 0.0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "bias_act_dropout_backward_cpu", [&] {
    const scalar_t* gp = grad.data_ptr<scalar_t>();
    const scalar_t* op_ = out.data_ptr<scalar_t>();
    const int32_t* mp = use_mask ? mask.data_ptr<int32_t>() : nullptr;
    scalar_t* gx = grad_x.data_ptr<scalar_t>();
    const acc_type<scalar_t> scale = static_cast<acc_type<scalar_t>>(p > 0.0 ? 1.0 / (1.0 - p) : 1.0);
    double* acc = need_bias_grad ? partial.data() : nullptr;
    run_team(team, [&](int thread, int size) {
      const auto [r0, r1] = thread_range(rows, thread, size);
      MORPHPIPE_CPU_DISPATCH(isa::backward_rows<scalar_t>(gp, op_, mp, gx, acc ? acc + thread * features : nullptr,
                                                          features, r0, r1, activation, scale));
    });
    if (need_bias_grad) {
      scalar_t* gb = grad_bias.data_ptr<scalar_t>();
      for (int64_t c = 0; c < features; ++c) {
        double sum = 0.0;
        for (int t = 0; t < team; ++t) sum += partial[t * features + c];
        gb[c] = static_cast<scalar_t>(sum);
      }
    }
  });
  return {grad_x, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(morphpipe, CPU, m) {
  m.impl("bias_act_dropout", &bias_act_dropout_cpu);
  m.impl("bias_act_dropout_backward", &bias_act_dropout_backward_cpu);
}

}  // namespace morphpipe
