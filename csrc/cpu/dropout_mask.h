// The dropout mask's definition, shared by the CPU and CUDA kernels so both draw the same bits:
// element i of a call with `seed` is kept when its 32-bit uniform is below the keep threshold.
// The uniforms come from SplitMix64 as a counter-based generator: pair i / 2 of elements takes
// output splitmix64(key + (i / 2) * gamma), the low half for even i and the high half for odd
// i, with key = splitmix64(seed). The mask is stored as bits: bit i % 32 of int32 word i / 32.
#pragma once

#include <cmath>
#include <cstdint>

#include "random.h"

namespace morphpipe {

constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ULL;
constexpr int64_t kMaskWordBits = 32;

// Activations the fused bias + activation + dropout op applies.
enum class Activation { kIdentity, kRelu };

// The per-call key of the counter-based generator.
MORPHPIPE_HOST_DEVICE inline uint64_t dropout_key(int64_t seed) { return splitmix64(static_cast<uint64_t>(seed)); }

// Two 32-bit uniforms for elements 2 * pair (low half) and 2 * pair + 1 (high half).
MORPHPIPE_HOST_DEVICE inline uint64_t dropout_pair(uint64_t key, int64_t pair) {
  return splitmix64(key + static_cast<uint64_t>(pair) * kSplitMixGamma);
}

// The 32-bit uniform of element i.
MORPHPIPE_HOST_DEVICE inline uint32_t dropout_uniform(uint64_t key, int64_t i) {
  return static_cast<uint32_t>(dropout_pair(key, i >> 1) >> (32 * (i & 1)));
}

// Elements whose uniform is below this are kept: round((1 - p) * 2^32), in [0, 2^32].
inline uint64_t keep_threshold(double p) { return static_cast<uint64_t>(std::llround((1.0 - p) * 4294967296.0)); }

// Number of int32 mask words for `n` elements.
MORPHPIPE_HOST_DEVICE inline int64_t mask_words(int64_t n) { return (n + kMaskWordBits - 1) / kMaskWordBits; }

}  // namespace morphpipe
