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
#include <optional>
#include <vector>

#include "common/random.h"
#include "common/sampling.h"
#include "cpu/choose_offsets.h"
#include "cpu/dense_node_map.h"
#include "cpu/node_map.h"

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
// Always inlined, so pick_all_positions keeps its generator in registers.
inline __attribute__((always_inline)) void pick_positions(int64_t begin, int64_t degree, int64_t taken,
                                                          Xoshiro256& rng, int64_t* picked,
                                                          std::vector<int64_t>& chosen,
                                                          std::vector<int64_t>& shuffle) {
  if (taken == degree) {
    for (int64_t offset = 0; offset < degree; ++offset) picked[offset] = begin + offset;
    return;
  }
  switch (taken) {  // the usual fanouts, unrolled (a jump table: one taken count a hop, so well predicted)
    case 1: return floyd_positions<1>(begin, degree, rng, picked);
    case 2: return floyd_positions<2>(begin, degree, rng, picked);
    case 3: return floyd_positions<3>(begin, degree, rng, picked);
    case 4: return floyd_positions<4>(begin, degree, rng, picked);
    case 5: return floyd_positions<5>(begin, degree, rng, picked);
    case 6: return floyd_positions<6>(begin, degree, rng, picked);
    case 7: return floyd_positions<7>(begin, degree, rng, picked);
    case 8: return floyd_positions<8>(begin, degree, rng, picked);
    case 9: return floyd_positions<9>(begin, degree, rng, picked);
    case 10: return floyd_positions<10>(begin, degree, rng, picked);
    case 11: return floyd_positions<11>(begin, degree, rng, picked);
    case 12: return floyd_positions<12>(begin, degree, rng, picked);
    case 13: return floyd_positions<13>(begin, degree, rng, picked);
    case 14: return floyd_positions<14>(begin, degree, rng, picked);
    case 15: return floyd_positions<15>(begin, degree, rng, picked);
    case 16: return floyd_positions<16>(begin, degree, rng, picked);
  }
  if (taken <= kFloydMaxFanout) {
    floyd_offsets(degree, taken, rng, picked);
    for (int64_t i = 0; i < taken; ++i) picked[i] += begin;
  } else {
    Xoshiro256 escaping = rng;  // its address leaves for choose_offsets; `rng` stays a register copy
    choose_offsets(degree, taken, escaping, chosen, shuffle);
    rng = escaping;
    for (const int64_t offset : chosen) *picked++ = begin + offset;
  }
}

// Pass 2 over destinations [0, num_dst): each one's picks, as positions in `indices`, at out[out_indptr[dst]..).
// The generator is copied into a local for the whole pass: the picks are int64 stores, which may alias the caller's
// uint64 state, so drawing from `rng` itself would store and reload the state around every destination.
inline void pick_all_positions(const int64_t* begins, const int64_t* degrees, const int64_t* out_indptr,
                               int64_t num_dst, Xoshiro256& rng, int64_t* out, std::vector<int64_t>& chosen,
                               std::vector<int64_t>& shuffle) {
  Xoshiro256 draws = rng;
  for (int64_t dst = 0; dst < num_dst; ++dst) {
    const int64_t taken = out_indptr[dst + 1] - out_indptr[dst];
    pick_positions(begins[dst], degrees[dst], taken, draws, out + out_indptr[dst], chosen, shuffle);
  }
  rng = draws;
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

// Runs `sample(map)` on a cleared relabelling map: the dense one when the graph has it, else the hash map, sized
// for a batch of `num_seeds` seeds.
template <typename Sample>
auto with_cleared_map(std::optional<DenseNodeMap>& dense_map, NodeMap& node_map, int64_t num_seeds, Sample&& sample) {
  if (dense_map) {
    dense_map->clear();
    return sample(*dense_map);
  }
  node_map.clear();
  node_map.reserve(num_seeds * 8);
  return sample(node_map);
}

}  // namespace morphpipe
