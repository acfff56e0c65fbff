"""Plan for machines you do not have: one profile re-read for other core counts and PCIe links.

What it shows: a `Profile` measured once (here, or by `morphpipe tune` on another machine)
predicts how the best plan and the two classic baselines (all-CPU pipeline, all-GPU over UVA)
would do on a machine with more cores or another PCIe link, without that machine: the
simulator replays the dual-buffer schedule from the measured phase times
(`morphpipe.scheduler.whatif`; `morphpipe simulate --help` states the model). A CPU-only
profile splits each core count between batching and training threads instead.

    python examples/what_if.py --dataset tiny --cores 1,2,4,8,16       # profile this machine first
    python examples/what_if.py --profile gpu-box.json --cores 8,16,32 --pcie-gbps 16,32,64
"""
from __future__ import annotations

import argparse
from pathlib import Path

from morphpipe.data import load_dataset
from morphpipe.profiler import Profile, Profiler
from morphpipe.scheduler import Plan
from morphpipe.scheduler.whatif import sweep


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=None,
                        help="a profile written by `morphpipe tune` (default: profile this machine on --dataset)")
    parser.add_argument("--dataset", default="default", help="preset or dataset directory to profile on")
    parser.add_argument("--fanouts", default="15,10,5", help="neighbours per hop, when profiling (default 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=1024, help="seeds per batch, when profiling (default 1024)")
    parser.add_argument("--profile-steps", type=int, default=8, help="timed steps per profiling measurement")
    parser.add_argument("--cores", default="1,2,4,8,16", help="core counts of the what-if machines (1,2,4,8,16)")
    parser.add_argument("--pcie-gbps", default=None,
                        help="PCIe bandwidths (GB/s) of the what-if machines, e.g. 16,32 (GPU profiles only)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated phase durations (default 0)")
    return parser.parse_args(argv)


def row(label: str, plan: Plan) -> str:
    baselines = "  ".join(f"{name} {seconds:8.3f}" for name, seconds in plan.baselines_s.items())
    threads = f"{plan.cpu_threads}" + (f"/{plan.train_threads}" if plan.train_threads else "")
    return (f"{label:>18}  plan {plan.predicted_epoch_s:8.3f} s  {baselines}  speedup {plan.speedup:5.2f}x  "
            f"CPU share {plan.cpu_share:6.1%}  threads {threads:>5}  {plan.kind}")


def main(argv: list[str] | None = None) -> dict:
    """Prints and returns one plan per (core count, PCIe bandwidth) of the what-if machines."""
    args = parse_args(argv)
    if args.profile is not None:
        profile = Profile.load(args.profile)
    else:
        graph = load_dataset(args.dataset)
        profile = Profiler(graph, fanouts=[int(f) for f in args.fanouts.split(",")], batch_size=args.batch_size,
                           steps=args.profile_steps, seed=args.seed, progress=False).run()
    print(f"profile: {profile.device}, {profile.cores} cores, {profile.num_batches} batches per epoch")
    cores = [int(c) for c in args.cores.split(",")]
    links = [None] if args.pcie_gbps is None else [float(g) for g in args.pcie_gbps.split(",")]
    plans: dict[tuple[int, float | None], Plan] = {}
    for link in links:
        for count, plan in zip(cores, sweep(profile, cores, link, seed=args.seed)):
            plans[count, link] = plan
            print(row(f"{count} cores" + ("" if link is None else f", {link:g} GB/s"), plan))
    return {"profile": profile, "plans": plans}


if __name__ == "__main__":
    main()
