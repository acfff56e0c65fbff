"""`morphpipe train` as one rank of a distributed run (torchrun, mpirun) or as the `--nproc N` launcher.

Every rank: joins the process group and takes its share of the node's cores; profiles that share
(`--auto`) or reads the profile given (`--profile`, a path each node may fill with its own);
the ranks exchange their predicted throughputs and split the seeds (`--split weighted` or
`even`); each plans its local batch; rank 0 prints the table of every rank's plan; then they
train data-parallel and evaluate together. `--batch-size` is the global batch (seeds per step
over all ranks).
"""
from __future__ import annotations

import argparse
import sys

from morphpipe.commands import arguments, tiering
from morphpipe.commands.train_report import print_epoch_summary, run_settings, write_stats
from morphpipe.commands.workload import (format_profile, model_from_spec, model_spec, workload_profiler,
                                         workload_settings, workload_task)
from morphpipe.distributed import env as dist_env
from morphpipe.distributed.runtime import DEFAULT_TIMEOUT_S, run_rank, start_rank
from morphpipe.distributed.split import SPLIT_MODES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The distributed options of `morphpipe train`."""
    parser.add_argument("--nproc", type=arguments.positive_int, default=None,
                        help="start N ranks on this machine (data-parallel, gloo; the cores are split between them)")
    parser.add_argument("--split", default="weighted", choices=SPLIT_MODES,
                        help="distributed runs: seeds per rank in proportion to each rank's predicted throughput "
                             "(weighted, default) or equal (even)")
    parser.add_argument("--dist-timeout", type=arguments.number(0, 1e7, above=True), default=DEFAULT_TIMEOUT_S,
                        help=f"distributed runs: seconds a collective may wait for a peer (default {DEFAULT_TIMEOUT_S:g})")


def wants_distributed(args: argparse.Namespace) -> bool:
    """True under a launcher (torchrun, mpirun) or with --nproc."""
    return args.nproc is not None or dist_env.detect() is not None


def without_nproc(argv: list[str]) -> list[str]:
    """The command line minus `--nproc N` (what each rank runs)."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--nproc":
            skip = True
        elif not item.startswith("--nproc="):
            kept.append(item)
    return kept


def run(args: argparse.Namespace) -> int:
    """Launches `--nproc` ranks, or runs this process as its launcher's rank."""
    if args.nproc is not None:
        if dist_env.detect() is not None:
            raise ValueError("--nproc starts ranks itself; leave it out under torchrun or mpirun")
        if args.nproc < 1:
            raise ValueError(f"--nproc must be >= 1, got {args.nproc!r}")
        from morphpipe.distributed.launcher import launch

        return launch([sys.executable, "-m", "morphpipe", *without_nproc(sys.argv[1:])], args.nproc)
    if args.plan is not None:
        raise ValueError("a saved plan is for one process; a distributed run plans every rank for its own share: "
                         "give --auto (each rank profiles) or --profile PROFILE.json")
    env = dist_env.detect()
    assert env is not None
    return run_rank(lambda: train_rank(args, env), env)


def train_rank(args: argparse.Namespace, env: dist_env.DistEnv) -> int:
    """One rank: profile, plan, split, train, evaluate."""
    import socket

    import torch
    import torch.distributed as dist

    from morphpipe.data import load_dataset
    from morphpipe.distributed.cluster import ClusterPrediction, local_profile, rank_table, throughput
    from morphpipe.distributed.split import SeedSplit
    from morphpipe.distributed.trainer import DistributedTrainer
    from morphpipe.profiler.cache_ranking import rank_cache_by_workload
    from morphpipe.profiler.profile import Profile
    from morphpipe.scheduler.planning import plan_from_profile

    cuda = args.device != "cpu" and torch.cuda.is_available()
    cores = start_rank(env, cuda=cuda, timeout_s=args.dist_timeout)
    rank, world = env.rank, env.world_size
    say = print if rank == 0 else (lambda *_: None)
    graph = load_dataset(args.dataset, progress=False, **arguments.feature_tier(args, fill_cache=False))
    given = Profile.load(args.profile) if args.profile is not None else None
    settings = workload_settings(args, given.workload if given is not None else None)
    if settings["precision"] != "float32":
        raise ValueError(f"{args.profile}: the profile was taken with {settings['precision']} training steps, and "
                         "distributed runs train in float32; profile with --precision float32 (or pass no --profile)")
    task = workload_task(settings)
    task.check_graph(graph)
    say(f"dataset {graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, {len(task.seeds(graph)):,} "
        f"training {'edges' if task.name == 'link' else 'seeds'}; {world} ranks ({env.launcher})")
    global_batch = int(settings["batch_size"])
    profile = given or workload_profiler(graph, args, settings, progress=False).run()
    if rank == 0 and given is None:
        print(format_profile(profile))
    rank_cache_by_workload(graph, task, settings["fanouts"], global_batch)
    if args.feature_cache_mb is not None:  # read once, in the workload's ranking
        graph.open_feature_store(tiering.planned_cache_bytes(args))
    mine = (f"{socket.gethostname()}:{_core_list(cores)}", throughput(profile, args.gbs, args.seed))
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    labels, throughputs = [item[0] for item in everyone], [item[1] for item in everyone]
    split = SeedSplit.make(len(task.seeds(graph)), global_batch, throughputs, args.split)
    plan = plan_from_profile(local_profile(profile, split.local_batches[rank], split.steps), args.gbs, args.seed)
    plans: list = [None] * world
    dist.all_gather_object(plans, plan)
    prediction = ClusterPrediction(split, tuple(plans), tuple(throughputs))
    say("plans per rank:\n" + rank_table(prediction, labels))
    torch.manual_seed(args.seed)
    model = model_from_spec(model_spec(graph, args, settings))
    with DistributedTrainer(graph, model, plan, split, fanouts=settings["fanouts"],
                            predicted_epoch_s=prediction.epoch_s, lr=args.lr, seed=args.seed,
                            task=task, checkpoint_dir=args.checkpoint_dir,
                            eval_batch_size=args.eval_batch_size, on_nonfinite=args.on_nonfinite) as trainer:
        history = trainer.fit(args.epochs)
        test_acc = trainer.evaluate("test")
    say(f"test {'accuracy' if task.metric == 'accuracy' else task.metric} {test_acc:.4f}")
    print_epoch_summary(history, prediction.epoch_s, say)
    if rank == 0 and args.stats_json is not None:
        head = {"world_size": world, "launcher": env.launcher, "split": split.describe(),
                "local_batches": list(split.local_batches), "ranks": labels, "throughputs": throughputs,
                "plans": [p.to_dict() for p in plans], "predicted_epoch_s": prediction.epoch_s}
        write_stats(args.stats_json, head, run_settings(settings, args, graph.name),
                    [vars(stats) for stats in history], test_acc)
    return 0


def _core_list(cores: list[int]) -> str:
    """'0-3' or '0,2': a compact core list for the table."""
    if cores and cores == list(range(cores[0], cores[-1] + 1)) and len(cores) > 1:
        return f"cores {cores[0]}-{cores[-1]}"
    return "core" + ("s " if len(cores) > 1 else " ") + ",".join(str(c) for c in cores)
