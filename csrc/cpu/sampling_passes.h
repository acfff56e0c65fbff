// The passes the homogeneous and the typed CPU samplers share. A hop (or a relation's part of one) runs four
// passes, each a stream of independent random reads prefetched ahead of its use: the destinations' indptr entries,
// the random choices (positions in `indices`, no memory read), the picked neighbours' ids at those positions, then
// the relabelling map's slots of those neighbours. A pick in a long list is a miss of its own (its list's first line
// does not hold it), so the ids are read edge by edge, each prefetched ahead. The random choices (in destination
// order) and the map's inserts (in edge order) are those of one fused loop, so the batch is the same.
// Each stream is prefetched twice: into L2 far ahead, then into L1 near. A thread's L1 tracks only a couple of
// dozen misses at once, L2 several times more, so requests sent to L2 first keep more misses in flight (on the
// Zen 4 machine, a batch of bench-1m sampled in about a quarter less CPU time, and a typed batch of mag in a fifth
// less: BENCHMARKS.md).
#pragma once

#include <cstdint>
#include <vector>

#include "common/random.h"
#include "common/sampling.h"
#include "cpu/choose_offsets.h"

namespace morphpipe {

// Prefetch distances, in destinations (indptr) or edges (picks, map slots), into L1 and into L2.
constexpr int64_t kIndptrPrefetch = 16;
constexpr int64_t kIndptrPrefetchL2 = 64;
constexpr int64_t kPickPrefetch = 32;
constexpr int64_t kPickPrefetchL2 = 128;
constexpr int64_t kSlotPrefetch = 32;
constexpr int64_t kSlotPrefetchL2 = 128;

// Pass 2 for one destination: `taken` distinct positions of its list [begin, begin + degree) into picked[0..taken),
// uniform over subsets (all of them when taken == degree). `chosen` and `shuffle` are scratch for large fanouts.
inline void pick_positions(int64_t begin, int64_t degree, int64_t taken, Xoshiro256& rng, int64_t* picked,
                           std::vector<int64_t>& chosen, std::vector<int64_t>& shuffle) {
  if (taken == degree) {
    for (int64_t offset = 0; offset < degree; ++offset) picked[offset] = begin + offset;
  } else if (taken <= kFloydMaxFanout) {
    floyd_offsets(degree, taken, rng, picked);
    for (int64_t i = 0; i < taken; ++i) picked[i] += begin;
  } else {
    choose_offsets(degree, taken, rng, chosen, shuffle);
    for (const int64_t offset : chosen) *picked++ = begin + offset;
  }
}

// Pass 4: relabels ids[0..count) in order to local ids (a node's local id is its order of first appearance, counted
// from `known`), writing each id past the known nodes in `nodes` and keeping it only when new: no branch on the
// outcome. `nodes` has room for known + count entries; returns the number of nodes known after.
template <typename Map>
int64_t relabel_in_order(Map& map, int64_t* ids, int64_t count, int64_t* nodes, int64_t known) {
  for (int64_t edge = 0; edge < count; ++edge) {
    if (edge + kSlotPrefetchL2 < count) map.prefetch_l2(ids[edge + kSlotPrefetchL2]);
    if (edge + kSlotPrefetch < count) map.prefetch(ids[edge + kSlotPrefetch]);
    const int64_t id = ids[edge];
    bool inserted;
    ids[edge] = map.insert(id, known, inserted);
    nodes[known] = id;
    known += inserted;
  }
  return known;
}

}  // namespace morphpipe
