"""Benchmark: which typed topology layout samples faster, one CSC per relation or one CSC with per-edge relation ids.

Both layouts hold the same edges of a heterogeneous dataset. The measured work is what the typed sampler
does per destination and relation: find the relation's neighbour range, draw `fanout` distinct offsets
(Floyd's algorithm, as csrc/cpu/choose_offsets.h) and read the chosen neighbours. One CSC per relation
(what HeteroGraphStore keeps) finds the range with one indptr read; the fused CSC (one indptr over the
global ids, each node's edges sorted by relation id) finds it with two binary searches in the node's
relation-id list. The kernels are compiled here (torch.utils.cpp_extension.load_inline), single-threaded,
over one hop from the training seeds for every relation into their type. Not a test.

Usage: python scripts/bench_hetero_layout.py [--dataset mag] [--fanout 10] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.presets import PRESETS
from morphpipe.data.store import ensure_preset

SOURCE = r"""
#include <torch/extension.h>
#include <algorithm>
#include <vector>

namespace {
struct Rng {
  uint64_t s;
  uint64_t next() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

template <typename Range>
int64_t sample(const int64_t* seeds, int64_t num_seeds, int64_t num_relations, const int32_t* const* indices,
               int64_t fanout, Range range) {
  Rng rng{0x9E3779B97F4A7C15ULL};
  std::vector<int64_t> chosen;
  int64_t checksum = 0;
  for (int64_t i = 0; i < num_seeds; ++i) {
    for (int64_t r = 0; r < num_relations; ++r) {
      int64_t begin, end;
      range(seeds[i], r, begin, end);
      const int64_t degree = end - begin;
      const int32_t* list = indices[r] + begin;
      if (degree <= fanout) {
        for (int64_t k = 0; k < degree; ++k) checksum += list[k];
        continue;
      }
      chosen.clear();
      for (int64_t upper = degree - fanout; upper < degree; ++upper) {
        const int64_t draw = rng.below(upper + 1);
        chosen.push_back(std::find(chosen.begin(), chosen.end(), draw) != chosen.end() ? upper : draw);
      }
      for (int64_t offset : chosen) checksum += list[offset];
    }
  }
  return checksum;
}
}  // namespace

// One CSC per relation: range = indptr_r[v], indptr_r[v + 1] (v local to the destination type).
int64_t per_relation(torch::Tensor seeds, std::vector<torch::Tensor> indptrs, std::vector<torch::Tensor> indices,
                     int64_t fanout) {
  std::vector<const int64_t*> ptrs;
  std::vector<const int32_t*> lists;
  for (auto& t : indptrs) ptrs.push_back(t.data_ptr<int64_t>());
  for (auto& t : indices) lists.push_back(t.data_ptr<int32_t>());
  return sample(seeds.data_ptr<int64_t>(), seeds.numel(), ptrs.size(), lists.data(), fanout,
                [&](int64_t v, int64_t r, int64_t& begin, int64_t& end) {
                  begin = ptrs[r][v];
                  end = ptrs[r][v + 1];
                });
}

// One CSC with per-edge relation ids (sorted within each node): two binary searches per node and relation.
int64_t fused(torch::Tensor seeds, torch::Tensor indptr, torch::Tensor indices, torch::Tensor relation_ids,
              std::vector<int64_t> relations, int64_t fanout) {
  const int64_t* ptr = indptr.data_ptr<int64_t>();
  const int8_t* ids = relation_ids.data_ptr<int8_t>();
  std::vector<const int32_t*> lists(relations.size(), indices.data_ptr<int32_t>());
  return sample(seeds.data_ptr<int64_t>(), seeds.numel(), relations.size(), lists.data(), fanout,
                [&](int64_t v, int64_t r, int64_t& begin, int64_t& end) {
                  const int8_t* first = ids + ptr[v];
                  const int8_t* last = ids + ptr[v + 1];
                  const int8_t relation = static_cast<int8_t>(relations[r]);
                  begin = std::lower_bound(first, last, relation) - ids;
                  end = std::upper_bound(ids + begin, last, relation) - ids;
                });
}
"""


def fused_layout(graph: HeteroGraphStore) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every relation's edges in one CSC over global ids (int32 source ids), with an int8 relation id per edge,
    each node's edges sorted by relation id."""
    starts = {t.name: t.start for t in graph.node_types}
    dst_parts, src_parts, rel_parts = [], [], []
    for number, relation in enumerate(graph.relations):
        indptr = graph.indptr[relation]
        degrees = indptr[1:] - indptr[:-1]
        dst_parts.append(torch.repeat_interleave(torch.arange(degrees.numel()), degrees) + starts[relation.dst])
        src_parts.append(graph.indices[relation].long() + starts[relation.src])
        rel_parts.append(torch.full((int(degrees.sum()),), number, dtype=torch.int64))
    dst, src, rel = torch.cat(dst_parts), torch.cat(src_parts), torch.cat(rel_parts)
    order = torch.argsort(dst * len(graph.relations) + rel, stable=True)
    counts = torch.bincount(dst, minlength=graph.num_nodes)
    indptr = torch.zeros(graph.num_nodes + 1, dtype=torch.long)
    torch.cumsum(counts, 0, out=indptr[1:])
    return indptr, src[order].to(torch.int32), rel[order].to(torch.int8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mag", help="a heterogeneous preset or dataset directory (default mag)")
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    directory = Path(args.dataset) if Path(args.dataset).is_dir() else ensure_preset(PRESETS[args.dataset])
    graph = HeteroGraphStore.load(directory, mmap=False)
    module = load_inline("morphpipe_bench_hetero_layout", cpp_sources=SOURCE, functions=["per_relation", "fused"],
                         extra_cflags=["-O3"])
    target = graph.node_type(graph.target_type)
    into_target = [number for number, r in enumerate(graph.relations) if r.dst == graph.target_type]
    seeds = graph.train_idx
    local_seeds = seeds - target.start
    indptrs = [graph.indptr[graph.relations[n]] for n in into_target]
    indices = [graph.indices[graph.relations[n]].to(torch.int32) for n in into_target]
    indptr, fused_indices, relation_ids = fused_layout(graph)
    load = os.getloadavg()[0]
    timings: dict[str, list[float]] = {"one CSC per relation": [], "one CSC + per-edge relation ids": []}
    for _ in range(args.repeats):
        start = time.perf_counter()
        first = module.per_relation(local_seeds, indptrs, indices, args.fanout)
        timings["one CSC per relation"].append(time.perf_counter() - start)
        start = time.perf_counter()
        second = module.fused(seeds, indptr, fused_indices, relation_ids, into_target, args.fanout)
        timings["one CSC + per-edge relation ids"].append(time.perf_counter() - start)
    load = max(load, os.getloadavg()[0])
    lookups = seeds.numel() * len(into_target)
    print(f"{graph!r}\n{seeds.numel():,} seeds x {len(into_target)} relations into {graph.target_type!r}, fanout "
          f"{args.fanout}, 1 thread, best of {args.repeats}; load average up to {load:.1f}")
    print("| layout | ns per (seed, relation) |\n|---|---|")
    for name, seconds in timings.items():
        print(f"| {name} | {min(seconds) / lookups * 1e9:.1f} |")
    print(f"(checksums {first} {second}: the fused layout reads sources as global ids, so they differ by the type "
          "offsets)")


if __name__ == "__main__":
    main()
