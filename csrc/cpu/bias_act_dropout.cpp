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

namespace morphpipe {

// Elements per random-draw chunk: 32 mask words, whose uniforms stay in L1.
constexpr int64_t kDrawChunk = 32 * kMaskWordBits;

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

// One contiguous run of a row: out[k] = act(x[k] + bias[k]) * factor[k], factor = scale or 0 where dropout draws
// (a multiply, not a select on the mask, so the loop vectorises for every dtype).
template <typename scalar_t, Activation kAct, bool kBias, bool kDrop>
inline void forward_run(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias, scalar_t* __restrict__ out,
                        const acc_type<scalar_t>* __restrict__ factor, int64_t run) {
  using acc_t = acc_type<scalar_t>;
#pragma omp simd
  for (int64_t k = 0; k < run; ++k) {
    acc_t y = static_cast<acc_t>(x[k]);
    if constexpr (kBias) y += static_cast<acc_t>(bias[k]);
    if constexpr (kAct == Activation::kRelu) y = y < acc_t(0) ? acc_t(0) : y;  // NaN stays NaN, as in torch.relu
    if constexpr (kDrop) y *= factor[k];
    out[k] = static_cast<scalar_t>(y);
  }
}

// Draws the dropout factors (scale where kept, else 0) of elements first .. first + len - 1 and their keep bytes
// (0 or 1), these zero-filled to a whole mask word. The hash loop runs within one 2^32-element span of indices,
// where the round key is constant, in 32-bit lanes only.
template <typename acc_t>
void draw_keep(acc_t* __restrict__ factor, uint8_t* __restrict__ keep, int64_t first, int64_t len, uint64_t key,
               uint32_t threshold, acc_t scale) {
  const uint32_t key_low = static_cast<uint32_t>(key);
  for (int64_t done = 0; done < len;) {
    const uint64_t index = static_cast<uint64_t>(first + done);
    const int64_t span = std::min<int64_t>(len - done, static_cast<int64_t>((index | 0xFFFFFFFFULL) - index) + 1);
    const uint32_t round_key = dropout_round_key(key, index >> 32);
    const uint32_t index_low = static_cast<uint32_t>(index);
    acc_t* __restrict__ span_factor = factor + done;
#pragma omp simd
    for (int64_t k = 0; k < span; ++k) {
      span_factor[k] = dropout_hash(index_low + static_cast<uint32_t>(k), key_low, round_key) < threshold ? scale
                                                                                                           : acc_t(0);
    }
    done += span;
  }
#pragma omp simd
  for (int64_t k = 0; k < len; ++k) keep[k] = factor[k] != acc_t(0);
  for (int64_t k = len; k % kMaskWordBits != 0; ++k) keep[k] = 0;
}

// Packs 32 keep bytes (0 or 1) into one mask word, byte j to bit j: eight bytes at a time, a multiply gathers
// byte b's low bit at bit 56 + b (no two partial products share a bit, so nothing carries into the top byte).
inline uint32_t pack_word(const uint8_t* keep) {
  uint32_t word = 0;
  for (int part = 0; part < 4; ++part) {
    uint64_t bytes;
    std::memcpy(&bytes, keep + 8 * part, sizeof(bytes));  // little-endian: byte b is element 8 * part + b
    word |= static_cast<uint32_t>((bytes * 0x0102040810204080ULL) >> 56) << (8 * part);
  }
  return word;
}

// out = keep * act(x + bias) * scale for elements [begin, end) of the flat [rows, F] array; mask bits
// for the words they cover (begin is a multiple of 32, end too except at the array's end).
template <typename scalar_t, Activation kAct, bool kBias, bool kDrop>
void forward_range(const scalar_t* x, const scalar_t* bias, scalar_t* out, int32_t* mask, int64_t features,
                   int64_t begin, int64_t end, uint64_t key, uint32_t threshold, double scale) {
  using acc_t = acc_type<scalar_t>;
  alignas(64) acc_t factor[kDrawChunk];
  alignas(64) uint8_t keep[kDrawChunk];
  for (int64_t chunk = begin; chunk < end; chunk += kDrawChunk) {
    const int64_t len = std::min(kDrawChunk, end - chunk);
    if constexpr (kDrop) draw_keep<acc_t>(factor, keep, chunk, len, key, threshold, static_cast<acc_t>(scale));
    for (int64_t i = chunk; i < chunk + len;) {
      const int64_t col = i % features;
      const int64_t run = std::min(features - col, chunk + len - i);
      forward_run<scalar_t, kAct, kBias, kDrop>(x + i, bias + (kBias ? col : 0), out + i, factor + (i - chunk), run);
      i += run;
    }
    if constexpr (kDrop) {
      for (int64_t w = 0; w * kMaskWordBits < len; ++w) {
        mask[(chunk >> 5) + w] = static_cast<int32_t>(pack_word(keep + w * kMaskWordBits));
      }
    }
  }
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
        forward_range<scalar_t, decltype(act)::value, decltype(has_bias)::value, decltype(drop)::value>(
            xp, bp, op_, mp, features, w0 * kMaskWordBits, std::min(n, w1 * kMaskWordBits), key, threshold, scale);
      });
    });
  });
  return {out, mask};
}

// grad_x for rows [r0, r1) of the flat [rows, F] arrays, and their column sums added into `acc` (when given).
// grad_x = grad * (scale where the element passed, else 0): multiplies, not selects, so the loops vectorise.
template <typename scalar_t>
void backward_rows(const scalar_t* grad, const scalar_t* out, const int32_t* mask, scalar_t* grad_x, double* acc,
                   int64_t features, int64_t r0, int64_t r1, Activation activation, acc_type<scalar_t> scale) {
  using acc_t = acc_type<scalar_t>;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t base = r * features;
    const scalar_t* __restrict__ g = grad + base;
    const scalar_t* __restrict__ o = out + base;
    scalar_t* __restrict__ d = grad_x + base;
    if (activation == Activation::kRelu) {
#pragma omp simd
      for (int64_t c = 0; c < features; ++c) {
        const acc_t pass = static_cast<acc_t>(o[c]) > acc_t(0) ? scale : acc_t(0);
        d[c] = static_cast<scalar_t>(static_cast<acc_t>(g[c]) * pass);
      }
    } else if (mask) {
#pragma omp simd
      for (int64_t c = 0; c < features; ++c) {
        const int64_t i = base + c;
        const acc_t pass = (static_cast<uint32_t>(mask[i >> 5]) >> (i & 31)) & 1u ? scale : acc_t(0);
        d[c] = static_cast<scalar_t>(static_cast<acc_t>(g[c]) * pass);
      }
    } else {
      std::memcpy(d, g, static_cast<size_t>(features) * sizeof(scalar_t));
    }
    if (acc) {
#pragma omp simd
      for (int64_t c = 0; c < features; ++c) acc[c] += static_cast<double>(d[c]);
    }
  }
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
      backward_rows<scalar_t>(gp, op_, mp, gx, acc ? acc + thread * features : nullptr, features, r0, r1, activation,
                              scale);
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
