"""Bring your own graph: an edge list and a numpy feature file, through the converter, to a trained model.

What it shows: the files a user typically has (an edge list as text, one `source destination`
pair per line; features as a `.npy` array [N, F]; labels as a `.npy` array [N]) converted into
morphpipe's dataset directory with `morphpipe.data.from_edge_list` (the same converter as
`morphpipe data convert edgelist EDGES -o DIR --features F.npy --labels L.npy`), then loaded
back memory-mapped and trained on under a plan made for this machine.

Without --edges it first writes a small demo graph's files (a planted partition: nodes of the
same class link more often, and features are noisy class centroids) so that it runs as is.

    python examples/own_graph.py --out graphs/demo
    python examples/own_graph.py --edges my_edges.txt --features my_feats.npy --labels my_labels.npy \\
        --undirected --out graphs/mine
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from morphpipe.data import ConvertOptions, GraphStore, SplitFractions, from_edge_list
from morphpipe.executor import Trainer
from morphpipe.nn import build_model
from morphpipe.profiler import Profiler
from morphpipe.scheduler import plan_from_profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=Path, default=None, help="edge list: text (src dst per line), .npy or .gz "
                                                                 "(default: write a demo graph's files first)")
    parser.add_argument("--features", type=Path, default=None, help=".npy [N, F] features (default: generated)")
    parser.add_argument("--labels", type=Path, default=None, help=".npy [N] integer labels, -1 = unlabelled")
    parser.add_argument("--undirected", action="store_true", help="add the reverse of every edge")
    parser.add_argument("--split", default="0.6,0.2,0.2", help="train,val,test fractions of a generated split")
    parser.add_argument("--out", type=Path, required=True, help="where to write the dataset directory")
    parser.add_argument("--demo-nodes", type=int, default=2000, help="nodes of the demo graph (default 2000)")
    parser.add_argument("--fanouts", default="10,5", help="neighbours per hop from the seeds (default 10,5)")
    parser.add_argument("--batch-size", type=int, default=256, help="seeds per batch (default 256)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train (default 5)")
    parser.add_argument("--profile-steps", type=int, default=4, help="timed steps per profiling measurement")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return parser.parse_args(argv)


def write_demo_files(directory: Path, num_nodes: int, seed: int) -> tuple[Path, Path, Path]:
    """A planted-partition graph as plain files: edges.txt, features.npy, labels.npy."""
    rng = np.random.default_rng(seed)
    num_classes, feature_dim, degree = 4, 16, 8
    labels = rng.integers(0, num_classes, num_nodes)
    src = np.repeat(np.arange(num_nodes), degree)
    same_class = rng.random(src.size) < 0.8  # 80% of the edges stay inside the class
    by_class = [np.flatnonzero(labels == c) for c in range(num_classes)]
    dst = rng.integers(0, num_nodes, src.size)
    for c in range(num_classes):
        pick = same_class & (labels[src] == c)
        dst[pick] = rng.choice(by_class[c], pick.sum())
    centroids = rng.standard_normal((num_classes, feature_dim))
    features = (centroids[labels] + 1.5 * rng.standard_normal((num_nodes, feature_dim))).astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    edges_path = directory / "edges.txt"
    with open(edges_path, "w") as f:
        f.write("# source destination\n")
        np.savetxt(f, np.stack([src, dst], axis=1), fmt="%d")
    np.save(directory / "features.npy", features)
    np.save(directory / "labels.npy", labels)
    return edges_path, directory / "features.npy", directory / "labels.npy"


def main(argv: list[str] | None = None) -> dict:
    """Converts, reloads and trains; returns the loaded graph and the test accuracy."""
    args = parse_args(argv)
    edges, features, labels = args.edges, args.features, args.labels
    if edges is None:
        edges, features, labels = write_demo_files(args.out.with_name(args.out.name + "-input"),
                                                   args.demo_nodes, args.seed)
        print(f"wrote a demo graph's files: {edges}, {features}, {labels}")

    # The converter: edges source -> destination; whatever is missing (features, labels, splits) is generated.
    options = ConvertOptions(make_undirected=args.undirected, split=SplitFractions.parse(args.split), seed=args.seed,
                             name=args.out.name)
    converted = from_edge_list(edges, features=None if features is None else np.load(features),
                               labels=None if labels is None else np.load(labels), options=options)
    converted.save(args.out)  # validated, written atomically
    print(f"same as: morphpipe data convert edgelist {edges} -o {args.out}"
          + (f" --features {features}" if features else "") + (f" --labels {labels}" if labels else "")
          + (" --undirected" if args.undirected else ""))

    graph = GraphStore.load(args.out)  # memory-mapped; the directory is what `morphpipe train DIR` takes
    print(f"{graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, {graph.feature_dim} features, "
          f"{graph.num_classes} classes, {len(graph.train_idx)}/{len(graph.val_idx)}/{len(graph.test_idx)} "
          "train/val/test")

    fanouts = [int(f) for f in args.fanouts.split(",")]
    torch.manual_seed(args.seed)
    profile = Profiler(graph, fanouts=fanouts, batch_size=args.batch_size, steps=args.profile_steps,
                       seed=args.seed, progress=False).run()
    plan = plan_from_profile(profile, seed=args.seed)
    model = build_model("sage", graph.feature_dim, graph.num_classes, num_layers=len(fanouts))
    with Trainer(graph, model, plan, fanouts=fanouts, batch_size=args.batch_size, seed=args.seed,
                 progress=False) as trainer:
        for stats in trainer.fit(epochs=args.epochs):
            print(f"epoch {stats.epoch}: loss {stats.loss:.4f}, val acc {stats.val_acc:.3f}")
        test_acc = trainer.evaluate("test")
    print(f"test accuracy {test_acc:.3f}")
    return {"graph": graph, "test_acc": test_acc}


if __name__ == "__main__":
    main()
