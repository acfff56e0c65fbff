// Uniform choice of distinct offsets within one neighbour list: what the homogeneous and the typed CPU
// samplers share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/random.h"
#include "common/sampling.h"

namespace morphpipe {

// Draws `count` distinct offsets in [0, degree) into `chosen` (uniform over subsets); `shuffle` is scratch.
inline void choose_offsets(int64_t degree, int64_t count, Xoshiro256& rng, std::vector<int64_t>& chosen,
                           std::vector<int64_t>& shuffle) {
  chosen.clear();
  if (count <= kFloydMaxFanout) {
    // Floyd's algorithm: exactly `count` draws, each subset equally likely.
    for (int64_t upper = degree - count; upper < degree; ++upper) {
      const int64_t draw = static_cast<int64_t>(rng.below(static_cast<uint64_t>(upper) + 1));
      const bool seen = std::find(chosen.begin(), chosen.end(), draw) != chosen.end();
      chosen.push_back(seen ? upper : draw);
    }
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
