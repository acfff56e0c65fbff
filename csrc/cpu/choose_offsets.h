// Uniform choice of distinct offsets within one neighbour list: what the homogeneous and the typed CPU
// samplers share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/random.h"
#include "common/sampling.h"

namespace morphpipe {

// Floyd's algorithm: `count` (at most kFloydMaxFanout) distinct offsets in [0, degree) into chosen[0..count),
// exactly `count` draws, each subset equally likely. Writes straight into the caller's buffer (no vector).
// The generator is copied in and back out: `chosen` (int64) may alias its uint64 state, so drawing from `rng`
// itself would store and reload the state around every write, lengthening each draw's dependency chain.
inline void floyd_offsets(int64_t degree, int64_t count, Xoshiro256& rng, int64_t* chosen) {
  Xoshiro256 local = rng;
  for (int64_t i = 0, upper = degree - count; upper < degree; ++i, ++upper) {
    const int64_t draw = static_cast<int64_t>(local.below(static_cast<uint64_t>(upper) + 1));
    chosen[i] = std::find(chosen, chosen + i, draw) != chosen + i ? upper : draw;
  }
  rng = local;
}

// floyd_offsets for a count fixed at compile time, with the list's start added: the same draws, in the same order,
// to the same positions. Unrolled, the picks so far stay in registers and each membership check is a fixed row of
// compares, where floyd_offsets' search loop changes its length with every draw and its exit is often mispredicted.
template <int kCount>
inline __attribute__((always_inline)) void floyd_positions(int64_t begin, int64_t degree, Xoshiro256& rng,
                                                           int64_t* __restrict picked) {
  int64_t chosen[kCount];
  int64_t upper = degree - kCount;
#pragma GCC unroll 16
  for (int i = 0; i < kCount; ++i, ++upper) {
    const int64_t draw = static_cast<int64_t>(rng.below(static_cast<uint64_t>(upper) + 1));
    bool seen = false;
#pragma GCC unroll 16
    for (int j = 0; j < i; ++j) seen |= chosen[j] == draw;
    chosen[i] = seen ? upper : draw;
    picked[i] = begin + chosen[i];
  }
}

// Draws `count` distinct offsets in [0, degree) into `chosen` (uniform over subsets); `shuffle` is scratch.
inline void choose_offsets(int64_t degree, int64_t count, Xoshiro256& rng, std::vector<int64_t>& chosen,
                           std::vector<int64_t>& shuffle) {
  chosen.clear();
  if (count <= kFloydMaxFanout) {
    chosen.resize(count);
    floyd_offsets(degree, count, rng, chosen.data());
    return;
  }
  shuffle.resize(degree);
  for (int64_t i = 0; i < degree; ++i) shuffle[i] = i;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(degree - i)));
    std::swap(shuffle[i], shuffle[j]);
    chosen.push_back(shuffle[i]);
  }
}

}  // namespace morphpipe
