"""`morphpipe evaluate DATASET --checkpoint DIR`: accuracy of a saved model (link prediction: MRR, Hits@K and AUC
against the stored negatives), exact (layer-wise) or sampled."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from morphpipe.commands import arguments, tiering
from morphpipe.commands.train import resolve_device
from morphpipe.commands.workload import model_from_spec, parse_relation_fanouts
from morphpipe.nn.evaluate import EVAL_MODES
from morphpipe.nn.task import SPLITS
from morphpipe.outputs import check_output_file, write_text_atomic

MIB = 1 << 20


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the `evaluate` sub-command."""
    parser = subparsers.add_parser(
        "evaluate", help="accuracy of a model saved by `morphpipe train --checkpoint-dir`",
        description="Rebuild the model saved in a checkpoint directory and measure its accuracy on the dataset's "
                    "splits: exactly, by layer-wise full-graph inference (default), or by sampled mini-batch "
                    "inference with the training fanouts.")
    parser.add_argument("dataset", nargs="?", default=None, help="preset name or dataset directory (default: default)")
    parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory written by train")
    parser.add_argument("--mode", default="full", choices=EVAL_MODES, help="full (exact, default) or sampled")
    parser.add_argument("--split", default="all", choices=[*SPLITS, "all"], help="which split (default: all)")
    parser.add_argument("--chunk-size", type=arguments.positive_int, default=None,
                        help="destinations per layer-wise chunk (default: from the memory budget)")
    parser.add_argument("--memory-mb", type=arguments.positive_int, default=None,
                        help="memory budget of layer-wise inference in MiB (default: half the available memory); "
                             "tables that do not fit are written to disk and read back through a feature store")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=4096, help="seeds per batch of sampled inference")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--json", type=Path, default=None, help="also write the accuracies to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    arguments.add_feature_tier_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Loads the checkpoint and the data, rebuilds the model, prints the accuracy of each split."""
    from morphpipe.data import load_dataset
    from morphpipe.executor.checkpoint import load_checkpoint
    from morphpipe.nn.evaluate import full_accuracies
    from morphpipe.ops.community import GraphBlock

    if args.json is not None:
        check_output_file(args.json, "--json")
    state = load_checkpoint(args.checkpoint)
    if state is None:
        raise FileNotFoundError(f"{args.checkpoint}: no checkpoint there; write one with `morphpipe train "
                                "--checkpoint-dir DIR`")
    spec = state.meta.get("model_spec")
    if not isinstance(spec, dict):
        raise ValueError(f"{args.checkpoint}: the checkpoint does not say how its model was built (no model_spec; "
                         "written by an older morphpipe); train again to evaluate it")
    graph = load_dataset(args.dataset, **arguments.feature_tier(args))
    tiering.place_features(graph, args)
    if state.meta.get("num_nodes") != graph.num_nodes:
        raise ValueError(f"{args.checkpoint}: the checkpoint is for dataset {state.meta.get('dataset')!r} with "
                         f"{state.meta.get('num_nodes')} nodes, but {graph.name!r} has {graph.num_nodes}; pass the "
                         "dataset it was trained on")
    model = model_from_spec(spec)
    model.load_state_dict(state.model)
    device = resolve_device(args.device)
    model.to(device)
    budget = None if args.memory_mb is None else args.memory_mb * MIB
    typed = getattr(graph, "is_hetero", False)
    block = GraphBlock.of(graph.indptr, graph.indices) if args.mode == "full" and not typed else None
    stopped = f" (and part of epoch {state.epoch + 1}: stopped mid epoch)" if state.partial_epoch is not None else ""
    print(f"model {spec['name']} from {args.checkpoint} after {state.epoch} epochs{stopped}; {args.mode} inference on "
          f"{graph.name} ({graph.num_nodes:,} nodes)")
    store = getattr(graph, "feature_store", None)
    if store is not None:
        print(f"features on disk, read through the feature store: {tiering.cached_rows(graph, store)}")
    said: set[str] = set()

    def say_once(message: str) -> None:
        if message not in said:
            said.add(message)
            print(message)

    if spec.get("task") == "link":
        results = evaluate_link(model, graph, state.meta, spec, args, device, block, say_once)
    else:
        splits = SPLITS if args.split == "all" else (args.split,)
        if args.mode == "full":  # one layer-wise pass for every split
            results = full_accuracies(model, graph, {split: getattr(graph, f"{split}_idx") for split in splits},
                                      device=device, chunk_size=args.chunk_size, memory_budget=budget,
                                      graph_block=block, progress=not args.no_progress, log=say_once)
        else:
            results = {split: sampled_accuracy(model, graph, getattr(graph, f"{split}_idx"), spec, args, device)
                       for split in splits}
        for split in splits:
            print(f"{split} accuracy {results[split]:.4f}")
    if args.json is not None:
        key = "link" if spec.get("task") == "link" else "accuracy"
        write_text_atomic(args.json, json.dumps({"mode": args.mode, "epochs": state.epoch, key: results},
                                                indent=2) + "\n", "--json")
        print(f"wrote {args.json}")
    return 0


def sampled_accuracy(model, graph, seeds: torch.Tensor, spec: dict, args: argparse.Namespace, device: str) -> float:
    """Accuracy on `seeds` by sampled inference with the training fanouts (a typed graph's per relation)."""
    from morphpipe.nn.evaluate import accuracy
    from morphpipe.nn.task import EvalSettings, NodeClassification

    if getattr(graph, "is_hetero", False):
        relation_fanouts = spec.get("relation_fanouts")
        task = NodeClassification(relation_fanouts=parse_relation_fanouts(relation_fanouts)
                                  if relation_fanouts else None)
        settings = EvalSettings(spec["fanouts"], batch_size=args.batch_size, mode=args.mode)
        return task.evaluate(model, graph, seeds, settings, device=torch.device(device))
    return accuracy(model, graph, seeds, spec["fanouts"], batch_size=args.batch_size, device=device)


def evaluate_link(model, graph, meta: dict, spec: dict, args: argparse.Namespace, device: str, block,
                  log) -> dict[str, dict[str, object]]:
    """MRR, Hits@K and AUC of a link model on the held-out edge splits (val, test: the ones with stored negatives)."""
    from morphpipe.nn.link_task import LinkPrediction
    from morphpipe.nn.task import EvalSettings

    task = LinkPrediction(**{key: meta[key] for key in ("negatives", "negative_kind", "decoder", "loss", "exclude")
                             if key in meta})
    task.check_graph(graph)
    if args.split == "train":
        raise ValueError("--split train: training edges have no stored negatives to rank against; evaluate val or "
                         "test (the default, all, takes both)")
    if args.chunk_size is not None or args.memory_mb is not None:
        raise ValueError("--chunk-size and --memory-mb size node classification's layer-wise tables; link "
                         "evaluation plans its own chunks: drop them")
    settings = EvalSettings(spec["fanouts"], args.batch_size, 0, args.mode, not args.no_progress, log)
    results = {}
    for split in ("val", "test") if args.split == "all" else (args.split,):
        metrics = task.metrics(model, graph, task.seeds(graph, split), settings, device=torch.device(device),
                               graph_block=(lambda: block) if block is not None else None)
        print(f"{split} {metrics.line()}")
        results[split] = metrics.to_dict()
    return results
