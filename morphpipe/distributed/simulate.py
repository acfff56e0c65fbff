"""`morphpipe simulate --node PROFILE:COUNT[:CORES] ...`: a cluster's epoch with even and weighted seed splits.

Each --node names one node type: a profile, how many nodes of it, and optionally a what-if core
count (the profile re-read for that many cores, as `--cores` does). One rank per node. Both
splits are planned rank by rank from the same simulator (morphpipe.distributed.cluster).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from morphpipe.distributed.cluster import ClusterPrediction, predict_cluster, profiled_batch_size
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler.whatif import what_if


@dataclass(frozen=True)
class NodeType:
    """`count` nodes measured by `profile` (re-read for `cores` cores when given)."""

    path: Path
    count: int
    cores: int | None

    @property
    def label(self) -> str:
        return self.path.name + (f" @{self.cores} cores" if self.cores is not None else "")


def parse_node(text: str) -> NodeType:
    """'profile.json', 'profile.json:2' or 'profile.json:2:8' (path, node count, what-if cores)."""
    parts = text.rsplit(":", 2)
    numbers: list[int] = []
    while len(parts) > 1 and parts[-1].isdigit():
        numbers.insert(0, int(parts.pop()))
    path = ":".join(parts)
    if not path or len(numbers) > 2 or any(n < 1 for n in numbers):
        raise argparse.ArgumentTypeError(f"--node must be PROFILE[:COUNT[:CORES]] with COUNT, CORES >= 1, got {text!r}")
    count = numbers[0] if numbers else 1
    return NodeType(Path(path), count, numbers[1] if len(numbers) > 1 else None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster options of `morphpipe simulate`."""
    parser.add_argument("--node", type=parse_node, action="append", default=None, metavar="PROFILE[:COUNT[:CORES]]",
                        help="a node type of a cluster (repeat): its profile, how many nodes, optionally a what-if "
                             "core count; predicts the cluster epoch with even and weighted seed splits")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="with --node: the global batch (default: the first profile's batch size)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="with --node: training seeds per epoch (default: the first profile's batches x batch size)")


def cluster_profiles(nodes: list[NodeType]) -> tuple[list[Profile], list[str]]:
    """One profile per rank (node), and a label per rank."""
    profiles, labels = [], []
    for node in nodes:
        profile = Profile.load(node.path)
        if node.cores is not None:
            profile = what_if(profile, node.cores).profile
        profiles += [profile] * node.count
        labels += [node.label] * node.count
    return profiles, labels


def format_cluster(nodes: list[NodeType], even: ClusterPrediction, weighted: ClusterPrediction) -> str:
    """Per node type: throughput, and local batch and epoch under each split; then the cluster epochs."""
    header = (f"{'node type':<28}  {'nodes':>5}  {'seeds/s':>9}  {'even batch':>10}  {'even (s)':>9}  "
              f"{'weighted batch':>14}  {'weighted (s)':>12}")
    rows, rank = [], 0
    for node in nodes:
        rows.append(f"{node.label:<28}  {node.count:>5}  {even.throughputs[rank]:>9.0f}  "
                    f"{even.split.local_batches[rank]:>10}  {even.plans[rank].predicted_epoch_s:>9.3f}  "
                    f"{weighted.split.local_batches[rank]:>14}  {weighted.plans[rank].predicted_epoch_s:>12.3f}")
        rank += node.count
    summary = (f"cluster epoch ({rank} ranks, {even.split.steps} steps of {even.split.global_batch} seeds): even "
               f"{even.epoch_s:.4g} s, weighted {weighted.epoch_s:.4g} s -> {even.epoch_s / weighted.epoch_s:.2f}x "
               "(slowest rank; all-reduce not modelled)")
    return "\n".join([header, *rows, summary])


def run_cluster(args: argparse.Namespace) -> int:
    """Plans the cluster under both splits and prints the table."""
    profiles, _ = cluster_profiles(args.node)
    batch = args.batch_size or profiled_batch_size(profiles[0])
    seeds = args.seeds or profiles[0].num_batches * profiled_batch_size(profiles[0])
    even = predict_cluster(profiles, seeds, batch, "even", args.gbs, args.seed)
    weighted = predict_cluster(profiles, seeds, batch, "weighted", args.gbs, args.seed, throughputs=even.throughputs)
    print(format_cluster(args.node, even, weighted))
    return 0
