"""The workload `tune` and `train` run: its flags, its settings (flags, else a plan's, else defaults), its profiler,
its model, and the table of its measured phases."""
from __future__ import annotations

import argparse

from torch import nn

from morphpipe.commands import arguments
from morphpipe.nn import build_model
from morphpipe.nn.factory import MODELS
from morphpipe.nn.hetero import HETERO_MODELS, build_hetero_model
from morphpipe.nn.link_model import DECODERS, build_link_model
from morphpipe.nn.link_task import LOSSES, LinkPrediction
from morphpipe.nn.task import TASKS, NodeClassification, Task, is_hetero, make_task
from morphpipe.nn.train_step import PRECISIONS
from morphpipe.numeric import format_bytes
from morphpipe.profiler.profile import PhaseTiming, Profile, ThreadScaling
from morphpipe.profiler.profiler import BUFFER_BATCHES, Profiler
from morphpipe.sampling.edge_batcher import NEGATIVE_KINDS

DEFAULTS = {"task": "node", "model": "sage", "fanouts": "15,10,5", "batch_size": 1024, "hidden": None,
            "relation_fanouts": None, "precision": "float32"}
PRECISION_CHOICES = (*PRECISIONS, "auto")
# The link task's options (--task link): flag defaults; a plan made for link prediction records its own.
LINK_DEFAULTS = {"negatives": 1, "negative_kind": "uniform", "decoder": "dot", "loss": "bce"}


def parse_int_list(text: str, name: str) -> list[int]:
    """'15,10,5' -> [15, 10, 5], with an error naming the option."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise ValueError(f"{name}: expected comma-separated integers such as 15,10,5, got {text!r}") from error


def add_workload_arguments(parser: argparse.ArgumentParser, from_plan: bool) -> None:
    """The dataset and the workload flags (model, hidden width, fanouts, batch size). With `from_plan` an unset
    flag is None, so that `workload_settings` takes the plan's value; else it is the default."""

    def default(key: str) -> object:
        return None if from_plan else DEFAULTS[key]

    def says(value: str) -> str:
        return f"default: the plan's, else {value}" if from_plan else f"default {value}"

    parser.add_argument("dataset", nargs="?", default=None, help="preset name or dataset directory (default: default)")
    parser.add_argument("--task", default=default("task"), choices=list(TASKS),
                        help=f"what is trained: node (classification) or link (prediction, on a dataset with an edge "
                             f"split: `morphpipe data split-edges`) ({says('node')})")
    link = parser.add_argument_group("link prediction (--task link)")
    link.add_argument("--negatives", type=arguments.non_negative_int, default=None,
                      help=f"corrupted destinations per training edge ({says('1')})")
    link.add_argument("--negative-kind", choices=NEGATIVE_KINDS, default=None,
                      help=f"how negatives are drawn: uniform over the nodes, or by in-degree^0.75 ({says('uniform')})")
    link.add_argument("--decoder", choices=DECODERS, default=None, help=f"pair scorer ({says('dot')})")
    link.add_argument("--loss", choices=LOSSES, default=None,
                      help=f"bce (positives vs negatives) or bpr (each positive above its negatives) ({says('bce')})")
    parser.add_argument("--model", default=default("model"), choices=[*MODELS, *HETERO_MODELS],
                        help=f"model ({says('sage')}); a heterogeneous dataset takes rgcn, rsage or rgat")
    parser.add_argument("--hidden", type=arguments.positive_int, default=None, help="hidden width (default: the paper's per model)")
    parser.add_argument("--fanouts", default=default("fanouts"),
                        help=f"neighbours per hop from the seeds ({says('15,10,5')}); one layer per hop")
    parser.add_argument("--relation-fanouts", nargs="+", default=None, metavar="RELATION=F1,F2",
                        help="a heterogeneous dataset's neighbours per hop for each relation (name every relation, "
                             "as its name or src__name__dst; 0 skips it), e.g. cites=10,5 writes=5,3 ...; default: "
                             "--fanouts for every relation")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=default("batch_size"),
                        help=f"seeds per batch ({says('1024')})")
    parser.add_argument("--precision", default=default("precision"), choices=PRECISION_CHOICES,
                        help="the training step's arithmetic, profiled as it will run: float32, bf16 (bfloat16 "
                             "autocast, float32 master weights) or auto (bf16 where the hardware has bfloat16 "
                             "arithmetic, AVX512-BF16 or AMX on a CPU, and the profiled step is faster; a plan's own "
                             f"precision when training from a plan) ({says('float32')})")
    arguments.add_feature_tier_arguments(parser)


def workload_settings(args: argparse.Namespace, workload: dict[str, object] | None = None) -> dict[str, object]:
    """Model, fanouts, batch size, hidden width and precision: the command line's, else `workload`'s (what a plan or
    profile records it was made for), else the defaults. Precision "auto" stays for the profiler to settle, but with a
    `workload` it is the one that workload was profiled in (float32 when it does not say)."""
    profiled = workload is not None
    workload = workload or {}
    chosen = {}
    for key, default in DEFAULTS.items():
        given = getattr(args, key)
        chosen[key] = given if given is not None else workload.get(key, default)
    if chosen["precision"] == "auto" and profiled:
        chosen["precision"] = workload.get("precision") or "float32"
    chosen["fanouts"] = parse_int_list(str(chosen["fanouts"]), "--fanouts")
    if chosen["relation_fanouts"] is not None:
        chosen["relation_fanouts"] = parse_relation_fanouts(chosen["relation_fanouts"])
    given_link = [f"--{key.replace('_', '-')}" for key in LINK_DEFAULTS if getattr(args, key, None) is not None]
    if chosen["task"] != LinkPrediction.name:
        if given_link:
            raise ValueError(f"{', '.join(given_link)} set{'s' if len(given_link) == 1 else ''} up link prediction; "
                             f"add --task link, or drop {'it' if len(given_link) == 1 else 'them'}")
        return chosen
    for key, default in LINK_DEFAULTS.items():
        given = getattr(args, key, None)
        chosen[key] = given if given is not None else workload.get(key, default)
    return chosen


def parse_relation_fanouts(given: object) -> dict[str, list[int]]:
    """['cites=10,5', 'writes=5,3'] (or a plan's recorded dict) -> {'cites': [10, 5], 'writes': [5, 3]}."""
    if isinstance(given, dict):
        return {str(key): parse_int_list(",".join(str(v) for v in value), f"--relation-fanouts {key}")
                for key, value in given.items()}
    parsed: dict[str, list[int]] = {}
    for entry in given:
        relation, sep, counts = str(entry).partition("=")
        if not sep or not relation:
            raise ValueError(f"--relation-fanouts: expected RELATION=F1,F2 such as cites=10,5, got {entry!r}")
        if relation in parsed:
            raise ValueError(f"--relation-fanouts: relation {relation!r} is given twice")
        parsed[relation] = parse_int_list(counts, f"--relation-fanouts {relation}")
    return parsed


def workload_task(settings: dict[str, object]) -> Task:
    """The task of the workload `settings`: the link task with its options, or node classification with the
    relation fanouts of a heterogeneous dataset."""
    if settings["task"] == LinkPrediction.name:
        if settings.get("relation_fanouts") is not None:
            raise ValueError("--relation-fanouts applies to --task node (heterogeneous graphs), not --task link")
        return make_task(LinkPrediction.name, **{key: settings[key] for key in LINK_DEFAULTS})
    task = make_task(str(settings["task"]))
    if settings.get("relation_fanouts") is not None:
        if not isinstance(task, NodeClassification):
            raise ValueError(f"--relation-fanouts applies to --task node, not {settings['task']!r}")
        task.relation_fanouts = settings["relation_fanouts"]
    return task


def workload_profiler(graph, args: argparse.Namespace, settings: dict[str, object], progress: bool,
                      **options: object) -> Profiler:
    """The Profiler of this machine on the run's workload (`options`: further Profiler arguments, e.g. warmup)."""
    return Profiler(
        graph, model=str(settings["model"]), fanouts=settings["fanouts"], batch_size=int(settings["batch_size"]),
        hidden=settings["hidden"], device=args.device,
        thread_counts=parse_int_list(args.threads, "--threads") if args.threads else None, steps=args.steps,
        seed=args.seed, progress=progress, task=workload_task(settings),
        memory_budget=getattr(args, "memory_budget", None), precision=str(settings["precision"]),
        buffer_batches=getattr(args, "gbs", BUFFER_BATCHES), **options,
    )


def model_spec(graph, args: argparse.Namespace, settings: dict[str, object]) -> dict[str, object]:
    """`build_model`'s arguments, saved in checkpoints so `morphpipe evaluate` can rebuild the model; a heterogeneous
    graph's model also records the node types, relations and target type it was shaped for; for link prediction
    `num_classes` is the embedding width and `decoder` the pair scorer."""
    task = workload_task(settings)
    if is_hetero(graph):
        if isinstance(task, LinkPrediction):
            raise ValueError(f"--task link needs a homogeneous dataset; {graph.name!r} is heterogeneous "
                             "(link prediction on typed graphs is not supported yet)")
        return {"name": str(settings["model"]), "hetero": {
                    "num_nodes": {t.name: t.count for t in graph.node_types}, "feature_dims": graph.feature_dims,
                    "relations": [list(r) for r in graph.relations], "target_type": graph.target_type},
                "num_classes": int(graph.num_classes), "num_layers": len(settings["fanouts"]),
                "hidden": settings["hidden"], "heads": args.heads, "dropout": args.dropout,
                "fanouts": list(settings["fanouts"]), "relation_fanouts": settings.get("relation_fanouts")}
    if settings["model"] in HETERO_MODELS:
        raise ValueError(f"model {settings['model']!r} needs a heterogeneous dataset; {graph.name!r} has one node and "
                         "one edge type: use sage, gcn, gat or mlp")
    spec = {"name": str(settings["model"]), "in_dim": int(graph.feature_dim), "num_classes": int(graph.num_classes),
            "num_layers": len(settings["fanouts"]), "hidden": settings["hidden"], "heads": args.heads,
            "dropout": args.dropout, "fanouts": list(settings["fanouts"])}
    if isinstance(task, LinkPrediction):
        spec.update(task=task.name, num_classes=task.embedding_size(settings["hidden"]), decoder=task.decoder)
    return spec


def model_from_spec(spec: dict[str, object]) -> nn.Module:
    """The (untrained) model a `model_spec` describes."""
    if "hetero" in spec:
        schema = spec["hetero"]
        return build_hetero_model(spec["name"], num_nodes=schema["num_nodes"], feature_dims=schema["feature_dims"],
                                  relations=[tuple(r) for r in schema["relations"]], target_type=schema["target_type"],
                                  num_classes=spec["num_classes"], num_layers=spec["num_layers"],
                                  hidden=spec["hidden"], heads=spec["heads"], dropout=spec["dropout"])
    if spec.get("task") == LinkPrediction.name:
        return build_link_model(spec["name"], spec["in_dim"], spec["num_classes"], decoder=spec["decoder"],
                                num_layers=spec["num_layers"], hidden=spec["hidden"], heads=spec["heads"],
                                dropout=spec["dropout"])
    return build_model(spec["name"], spec["in_dim"], spec["num_classes"], num_layers=spec["num_layers"],
                       hidden=spec["hidden"], heads=spec["heads"], dropout=spec["dropout"])


def format_timing(timing: PhaseTiming) -> str:
    return f"{timing.mean_s * 1e3:9.2f} ms  (cv {timing.cv:.0%}, {timing.samples} samples)"


def format_scaling(name: str, scaling: ThreadScaling) -> list[str]:
    return [f"  {name} x{threads:<3} {format_timing(timing)}" for threads, timing in scaling.points.items()]


def format_profile(profile: Profile) -> str:
    """The measured phase times as a table (per delivered batch)."""
    lines = [f"measured phases (per batch; {profile.num_batches} batches of {profile.batch_bytes / 1e6:.1f} MB "
             f"per epoch, {profile.cores} usable cores):"]
    if profile.contention:
        contention = profile.contention
        lines.insert(1, f"  measured on a {'BUSY' if profile.taken_on_busy_machine else 'quiet'} machine: other "
                        f"processes used {contention['other_cores']:.2f} of {contention['cores']} cores, "
                        f"load {contention['load_average']:.2f}")
    lines += format_scaling("CPU batching    ", profile.cpu_batching)
    if profile.cpu_training is not None:
        lines += format_scaling("CPU training    ", profile.cpu_training)
    for name, timing in (("GPU batching    ", profile.gpu_batching), ("DMA to GPU      ", profile.dma),
                         ("GPU training    ", profile.training)):
        if timing is not None:
            lines.append(f"  {name}     {format_timing(timing)}")
    if profile.disk is not None:
        disk = profile.disk
        facts = disk.facts
        lines.append(f"  disk             {facts.random_reads_per_s:,.0f} random {facts.block} B reads/s at queue depth "
                     f"{facts.queue_depth}, sequential {facts.sequential_bytes_per_s / 1e9:.2f} GB/s; "
                     f"{disk.rows_per_batch:,.0f} rows of {disk.row_bytes} B per batch"
                     + (f" ({disk.gpu_rows_per_batch:,.0f} per GPU batch, read apart from its T_GB)"
                        if disk.gpu_rows_per_batch is not None else ""))
        if disk.store_reads_per_s is not None:
            lines.append(f"  feature store    {disk.store_reads_per_s:,.0f} reads/s as its read timer measured them on "
                         "the profiled batches")
        lines.append("  hit ratio        " + ", ".join(f"{format_bytes(size)} {ratio:.1%}"
                                                      for size, ratio in disk.hit_curve)
                     + f" (cache budget {format_bytes(disk.cache_budget_bytes)})")
        lines.append("  reads per miss   " + ", ".join(f"{format_bytes(size)} {disk.reads_per_miss_at(size):.3g}"
                                                      for size, _ in disk.hit_curve))
        if disk.reads_per_s_curve:
            lines.append("  store reads/s    " + ", ".join(f"{format_bytes(size)} {disk.reads_per_s_at(size):,.0f}"
                                                          for size, _ in disk.hit_curve)
                         + " (timed reading each cache size's misses)")
        if disk.read_bytes_curve:
            lines.append("  bytes per read   " + ", ".join(
                f"{format_bytes(size)} {disk.read_bytes_at(size) / 1e3:,.1f} kB" for size, _ in disk.hit_curve))
        for size in disk.io_read_sizes():
            lines.append("  by I/O threads   " + ", ".join(f"{point.io_threads}: {point.reads_per_s:,.0f} reads/s, "
                                                          f"{point.cpu_s_per_read * 1e6:.3g} us CPU a read"
                                                          for point in disk.io_curve if point.read_bytes == size)
                         + (f" (reads of {size / 1e3:,.1f} kB;" if size is not None else " (")
                         + f" the rates above at {disk.io_threads})")
    return "\n".join(lines)
