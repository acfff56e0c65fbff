"""A plan per rank and the cluster's predicted epoch, from one profile per rank (or per node type).

Model: a rank's per-batch phase times scale with its seeds per batch (sampling, gathering,
transfer and training all grow with the seeds), so a profile measured at batch size B reads,
for a local batch b, as the same profile with every phase time multiplied by b / B. Each rank's
predicted throughput is the seeds per second of its own plan at the profiled batch size; the
weighted split gives it a local batch in that proportion. Every step waits for the slowest rank
(the gradient all-reduce), so the cluster epoch is predicted as the longest rank epoch; the
all-reduce itself is not modelled.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from morphpipe.distributed.split import SeedSplit
from morphpipe.profiler.profile import Profile, ThreadScaling
from morphpipe.scheduler.plan import Plan, count_of
from morphpipe.scheduler.planning import plan_from_profile
from morphpipe.scheduler.whatif import what_if


def profiled_batch_size(profile: Profile) -> int:
    """The batch size the profile's phases were measured at (its workload's `batch_size`)."""
    value = profile.workload.get("batch_size")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"the profile's workload.batch_size is {value!r}; a profile written by `morphpipe tune` "
                         "records it, re-profile with this morphpipe")
    return value


def local_profile(profile: Profile, local_batch: int, steps: int) -> Profile:
    """The profile read for `steps` batches of `local_batch` seeds (phase times scaled by seeds per batch)."""
    factor = local_batch / profiled_batch_size(profile)

    def scaling(value: ThreadScaling | None) -> ThreadScaling | None:
        return None if value is None else ThreadScaling({t: p.scaled(factor) for t, p in value.points.items()})

    def timing(value):
        return None if value is None else value.scaled(factor)

    return replace(
        profile, num_batches=steps, batch_bytes=round(profile.batch_bytes * factor),
        cpu_batching=scaling(profile.cpu_batching), cpu_training=scaling(profile.cpu_training),
        gpu_batching=timing(profile.gpu_batching), dma=timing(profile.dma), training=timing(profile.training),
        uva_transfer_s=None if profile.uva_transfer_s is None else profile.uva_transfer_s * factor,
        workload={**profile.workload, "batch_size": local_batch},
    )


def throughput(profile: Profile, gbs: int = 10, seed: int = 0) -> float:
    """Predicted training seeds per second of the profile's own plan (the weight of its rank)."""
    plan = plan_from_profile(profile, gbs, seed, engine="fast")
    return profiled_batch_size(profile) * profile.num_batches / plan.predicted_epoch_s


def rank_plan(profile: Profile, split: SeedSplit, rank: int, gbs: int = 10, seed: int = 0) -> Plan:
    """Rank `rank`'s plan for its local batch and the split's step count."""
    return plan_from_profile(local_profile(profile, split.local_batches[rank], split.steps), gbs, seed)


@dataclass(frozen=True)
class ClusterPrediction:
    """One split of a cluster: every rank's plan, and the epoch (the slowest rank's)."""

    split: SeedSplit
    plans: tuple[Plan, ...]
    throughputs: tuple[float, ...]

    @property
    def epoch_s(self) -> float:
        return max(plan.predicted_epoch_s for plan in self.plans)


def predict_cluster(profiles: Sequence[Profile], num_seeds: int, global_batch: int, mode: str, gbs: int = 10,
                    seed: int = 0, throughputs: Sequence[float] | None = None) -> ClusterPrediction:
    """Plans every rank of a cluster (one profile per rank) under the `mode` split; same profiles plan once."""
    if throughputs is None:
        known: dict[int, float] = {}
        throughputs = [known.setdefault(id(p), throughput(p, gbs, seed)) for p in profiles]
    split = SeedSplit.make(num_seeds, global_batch, throughputs, mode)
    cache: dict[tuple[int, int], Plan] = {}
    plans = []
    for rank, profile in enumerate(profiles):
        key = (id(profile), split.local_batches[rank])
        if key not in cache:
            cache[key] = rank_plan(profile, split, rank, gbs, seed)
        plans.append(cache[key])
    return ClusterPrediction(split, tuple(plans), tuple(throughputs))


def plan_columns(plan: Plan) -> str:
    """A plan in a few words: schedule, CPU:GPU batches, thread counts."""
    threads = count_of(plan.cpu_threads, "batching thread")
    if plan.train_threads:
        threads += f", {plan.train_threads} training" + (" (turns)" if plan.shares_cores else "")
    return f"{plan.kind} {plan.n_cpu}:{plan.n_gpu}, {threads}"


def rank_table(prediction: ClusterPrediction, labels: Sequence[str]) -> str:
    """Rank 0's table: every rank's plan, predicted throughput, local batch and predicted epoch."""
    split = prediction.split
    header = f"{'rank':>4}  {'where':<22}  {'seeds/s':>9}  {'batch':>6}  {'epoch (s)':>9}  plan"
    rows = [
        f"{rank:>4}  {labels[rank]:<22}  {prediction.throughputs[rank]:>9.0f}  {split.local_batches[rank]:>6}  "
        f"{plan.predicted_epoch_s:>9.3f}  {plan_columns(plan)}"
        for rank, plan in enumerate(prediction.plans)
    ]
    return "\n".join([header, *rows, f"{split.describe()}; predicted epoch {prediction.epoch_s:.3f} s "
                                     "(slowest rank; all-reduce not modelled)"])


@dataclass(frozen=True)
class NodeType:
    """`count` nodes measured by `profile` (re-read for `cores` cores when given)."""

    path: Path
    count: int
    cores: int | None

    @property
    def label(self) -> str:
        return self.path.name + (f" @{self.cores} cores" if self.cores is not None else "")


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
