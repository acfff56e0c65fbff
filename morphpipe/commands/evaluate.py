"""`morphpipe evaluate DATASET --checkpoint DIR`: accuracy of a saved model, exact (layer-wise) or sampled."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from morphpipe.commands import arguments
from morphpipe.commands.train import resolve_device
from morphpipe.commands.workload import model_from_spec, parse_relation_fanouts
from morphpipe.nn.evaluate import EVAL_MODES
from morphpipe.nn.task import SPLITS

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
                             "tables that do not fit are memory-mapped on disk")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=4096, help="seeds per batch of sampled inference")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--json", type=Path, default=None, help="also write the accuracies to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Loads the checkpoint and the data, rebuilds the model, prints the accuracy of each split."""
    from morphpipe.data import load_dataset
    from morphpipe.executor.checkpoint import load_checkpoint
    from morphpipe.nn.evaluate import accuracy, full_accuracy
    from morphpipe.nn.task import EvalSettings, NodeClassification
    from morphpipe.ops.community import GraphBlock

    state = load_checkpoint(args.checkpoint)
    if state is None:
        raise FileNotFoundError(f"{args.checkpoint}: no checkpoint there; write one with `morphpipe train "
                                "--checkpoint-dir DIR`")
    spec = state.meta.get("model_spec")
    if not isinstance(spec, dict):
        raise ValueError(f"{args.checkpoint}: the checkpoint does not say how its model was built (no model_spec; "
                         "written by an older morphpipe); train again to evaluate it")
    graph = load_dataset(args.dataset)
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
    print(f"model {spec['name']} from {args.checkpoint} after {state.epoch} epochs; {args.mode} inference on "
          f"{graph.name} ({graph.num_nodes:,} nodes)")
    said: set[str] = set()

    def say_once(message: str) -> None:
        if message not in said:
            said.add(message)
            print(message)

    results = {}
    for split in SPLITS if args.split == "all" else (args.split,):
        seeds = getattr(graph, f"{split}_idx")
        if args.mode == "full" and not typed:
            results[split] = full_accuracy(model, graph, seeds, device=device, chunk_size=args.chunk_size,
                                           memory_budget=budget, graph_block=block, progress=not args.no_progress,
                                           log=say_once)
        elif typed:
            relation_fanouts = spec.get("relation_fanouts")
            task = NodeClassification(relation_fanouts=parse_relation_fanouts(relation_fanouts)
                                      if relation_fanouts else None)
            settings = EvalSettings(spec["fanouts"], batch_size=args.batch_size, mode=args.mode)
            results[split] = task.evaluate(model, graph, seeds, settings, device=torch.device(device))
        else:
            results[split] = accuracy(model, graph, seeds, spec["fanouts"], batch_size=args.batch_size,
                                      device=device)
        print(f"{split} accuracy {results[split]:.4f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"mode": args.mode, "epochs": state.epoch, "accuracy": results}, indent=2)
                             + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0
