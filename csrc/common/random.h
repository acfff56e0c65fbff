// Small, fast, seedable random source for samplers: one per batch, so results depend
// only on (epoch seed, batch index) and never on which thread built the batch.
#pragma once

#include <cstdint>

namespace morphpipe {

#ifdef __CUDACC__
#define MORPHPIPE_HOST_DEVICE __host__ __device__
#else
#define MORPHPIPE_HOST_DEVICE
#endif

// splitmix64's finaliser: a bijective 64-bit mix (seeds xoshiro here; the GPU sampler's counter-based draws).
MORPHPIPE_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// xoshiro256** (Blackman & Vigna): 2^256 period, passes BigCrush, a few ns per draw.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (auto& word : state_) {
      seed = splitmix64(seed);
      word = seed;
    }
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform integer in [0, bound), unbiased (Lemire's multiply-shift with rejection).
  uint64_t below(uint64_t bound) {
    if (bound <= 0xFFFFFFFFULL) {
      const uint32_t bound32 = static_cast<uint32_t>(bound);
      uint64_t product = (next() >> 32) * bound32;
      uint32_t low = static_cast<uint32_t>(product);
      if (low < bound32) {
        const uint32_t threshold = static_cast<uint32_t>(-bound32) % bound32;
        while (low < threshold) {
          product = (next() >> 32) * bound32;
          low = static_cast<uint32_t>(product);
        }
      }
      return product >> 32;
    }
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t draw;
    do {
      draw = next();
    } while (draw >= limit);
    return draw % bound;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

}  // namespace morphpipe
