// The dropout mask's definition, shared by the CPU and CUDA kernels so both draw the same bits:
// element i of a call with `seed` is kept when its 32-bit hash is below the keep threshold
// round((1 - p) * 2^32) (p in steps of 2^-32). The hash is counter-based, so any thread may draw
// any element: two keyed rounds of a 32-bit integer mix (Wellons' lowbias32 constants) over the
// low 32 bits of i, the key = splitmix64(seed) entering before each round and i's high 32 bits
// with the second. Only 32-bit multiplies and shifts: the CPU loop vectorises on plain SSE2.
// The mask is stored as bits: bit i % 32 of int32 word i / 32.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/random.h"

namespace morphpipe {

constexpr int64_t kMaskWordBits = 32;
constexpr uint32_t kHighWordGamma = 0x9E3779B9u;

// Activations the fused bias + activation + dropout op applies.
enum class Activation { kIdentity, kRelu };

// The per-call key of the counter-based generator.
MORPHPIPE_HOST_DEVICE inline uint64_t dropout_key(int64_t seed) { return splitmix64(static_cast<uint64_t>(seed)); }

// One bijective 32-bit mix round (lowbias32: xorshift-multiply twice).
MORPHPIPE_HOST_DEVICE inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21F0AAADu;
  x ^= x >> 15;
  x *= 0x735A2D97u;
  return x ^ (x >> 15);
}

// The second round's key for elements whose index has high word `index_high`: constant over 2^32 elements.
MORPHPIPE_HOST_DEVICE inline uint32_t dropout_round_key(uint64_t key, uint64_t index_high) {
  return static_cast<uint32_t>(key >> 32) ^ static_cast<uint32_t>(index_high) * kHighWordGamma;
}

// The hash of the element whose index has low word `index_low`, given the key's low word and the round key.
MORPHPIPE_HOST_DEVICE inline uint32_t dropout_hash(uint32_t index_low, uint32_t key_low, uint32_t round_key) {
  return mix32(mix32(index_low ^ key_low) ^ round_key);
}

// The 32-bit hash of element i of the call keyed `key`.
MORPHPIPE_HOST_DEVICE inline uint32_t dropout_bits(uint64_t key, int64_t i) {
  const uint64_t index = static_cast<uint64_t>(i);
  return dropout_hash(static_cast<uint32_t>(index), static_cast<uint32_t>(key), dropout_round_key(key, index >> 32));
}

// Elements whose hash is below this are kept: round((1 - p) * 2^32), at least 1 (p < 1), at most 2^32 - 1.
inline uint32_t keep_threshold(double p) {
  const double kept = std::nearbyint((1.0 - p) * 4294967296.0);
  return kept < 1.0 ? 1u : (kept > 4294967295.0 ? 4294967295u : static_cast<uint32_t>(kept));
}

// Number of int32 mask words for `n` elements.
MORPHPIPE_HOST_DEVICE inline int64_t mask_words(int64_t n) { return (n + kMaskWordBits - 1) / kMaskWordBits; }

}  // namespace morphpipe
