// The fused bias + activation + dropout kernels (the forward with its mask draw and packing, the backward),
// compiled once per CPU capability by for_each_capability.h inside that level's namespace: no include guard
// and no includes (bias_act_dropout.cpp includes what they use first). The mask's bits are integer work, so
// every level draws the same mask.

// One contiguous run of a row: out[k] = act(x[k] + bias[k]) * factor[k], factor = scale or 0 where dropout draws
// (a multiply, not a select on the mask, so the loop vectorises for every dtype).
template <typename scalar_t, Activation kAct, bool kBias, bool kDrop>
inline void forward_run(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias, scalar_t* __restrict__ out,
                        const acc_type<scalar_t>* __restrict__ factor, int64_t run) {
  using acc_t = acc_type<scalar_t>;
#pragma omp simd
  for (int64_t k = 0; k < run; ++k) {
    acc_t y = widen<acc_t>(x[k]);
    if constexpr (kBias) y += widen<acc_t>(bias[k]);
    if constexpr (kAct == Activation::kRelu) y = y < acc_t(0) ? acc_t(0) : y;  // NaN stays NaN, as in torch.relu
    if constexpr (kDrop) y *= factor[k];
    out[k] = narrow<scalar_t>(y);
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
        const acc_t pass = widen<acc_t>(o[c]) > acc_t(0) ? scale : acc_t(0);
        d[c] = narrow<scalar_t>(widen<acc_t>(g[c]) * pass);
      }
    } else if (mask) {
#pragma omp simd
      for (int64_t c = 0; c < features; ++c) {
        const int64_t i = base + c;
        const acc_t pass = (static_cast<uint32_t>(mask[i >> 5]) >> (i & 31)) & 1u ? scale : acc_t(0);
        d[c] = narrow<scalar_t>(widen<acc_t>(g[c]) * pass);
      }
    } else {
      std::memcpy(d, g, static_cast<size_t>(features) * sizeof(scalar_t));
    }
    if (acc) {
#pragma omp simd
      for (int64_t c = 0; c < features; ++c) acc[c] += static_cast<double>(widen<acc_t>(d[c]));
    }
  }
}
