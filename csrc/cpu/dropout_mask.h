// The dropout mask's definition, shared by the CPU and CUDA kernels so both draw the same bits:
// element i of a call with `seed` is kept when its 16-bit uniform is below the keep threshold
// (p in steps of 2^-16, as fused dropout kernels do with 8 bits, e.g. FlashAttention's).
// The uniforms come from SplitMix64 as a counter-based generator: quad i / 4 of elements takes
// output splitmix64(key + (i / 4) * gamma), 16 bits each, element 4q + j bits [16j, 16j + 16),
// with key = splitmix64(seed). The mask is stored as bits: bit i % 32 of int32 word i / 32.
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

// Four 16-bit uniforms for elements 4 * quad + j, j = 0..3 (bits [16j, 16j + 16)).
MORPHPIPE_HOST_DEVICE inline uint64_t dropout_quad(uint64_t key, int64_t quad) {
  return splitmix64(key + static_cast<uint64_t>(quad) * kSplitMixGamma);
}

// The 16-bit uniform of element i.
MORPHPIPE_HOST_DEVICE inline uint16_t dropout_uniform(uint64_t key, int64_t i) {
  return static_cast<uint16_t>(dropout_quad(key, i >> 2) >> (16 * (i & 3)));
}

// Elements whose uniform is at most this are kept: round((1 - p) * 2^16) - 1, at least 0 (keep rate 2^-16 for
// p within 2^-17 of 1); p = 0 keeps every element.
inline uint16_t keep_threshold(double p) {
  const long long kept = std::llround((1.0 - p) * 65536.0);
  return static_cast<uint16_t>(kept < 1 ? 0 : kept - 1);
}

// Number of int32 mask words for `n` elements.
MORPHPIPE_HOST_DEVICE inline int64_t mask_words(int64_t n) { return (n + kMaskWordBits - 1) / kMaskWordBits; }

}  // namespace morphpipe
