"""`morphpipe bench`: CPU batcher throughput on a dataset for several thread counts."""
from __future__ import annotations

import argparse
import json

from morphpipe.commands import arguments
from morphpipe.commands.workload import parse_int_list
from morphpipe.cores import usable_cores
from morphpipe.nn.task import NodeClassification
from morphpipe.outputs import check_output_file, write_text_atomic
from morphpipe.sampling.throughput import measure_throughput


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="measure the CPU batcher's throughput on a dataset")
    parser.add_argument("dataset", nargs="?", default=None, help="preset name or dataset directory (default: default)")
    parser.add_argument("--fanouts", default="15,10,5", help="neighbours per hop from the seeds (default 15,10,5)")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=1024, help="seeds per batch (default 1024)")
    parser.add_argument("--threads", default=None, help="thread counts to try, e.g. 1,2,4 (default 1..usable cores)")
    parser.add_argument("--batches", type=arguments.positive_int, default=30, help="batches measured per thread count")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results to this JSON file")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from morphpipe.data import load_dataset

    if args.batches < 1:
        raise ValueError(f"--batches {args.batches}: measure at least 1 batch per thread count")
    if args.json_path:
        check_output_file(args.json_path, "--json")
    graph = load_dataset(args.dataset)
    fanouts = parse_int_list(args.fanouts, "--fanouts")
    threads = parse_int_list(args.threads, "--threads") if args.threads else list(range(1, usable_cores() + 1))
    print(f"{graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges; fanouts {fanouts}, "
          f"batch {args.batch_size}")
    print(f"{'threads':>7}{'batches/s':>11}{'Medges/s':>10}{'GB/s feat':>11}{'MB/batch':>10}")
    rows = []
    for count in threads:
        with NodeClassification().batcher(graph, fanouts, args.batch_size, num_threads=count) as batcher:
            result = measure_throughput(batcher, max_batches=args.batches)
        rows.append({"threads": count, **result.to_dict()})
        print(f"{count:>7}{result.batches_per_s:>11.2f}{result.edges_per_s / 1e6:>10.2f}"
              f"{result.feature_bytes_per_s / 1e9:>11.3f}{result.bytes_per_batch / 1e6:>10.2f}")
    if args.json_path:
        document = {"dataset": graph.name, "fanouts": fanouts, "batch_size": args.batch_size, "rows": rows}
        write_text_atomic(args.json_path, json.dumps(document, indent=2) + "\n", "--json")
    return 0
