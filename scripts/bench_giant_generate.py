"""Benchmark: generation of graphs larger than the memory budget (issue 21, the generation half of bench_giant).

1. Peak RSS against the edge count: one node count, growing average degree, one memory budget;
   with the external sort the peak stays put while the edges grow.
2. The papers100m-like preset (111M nodes, 1.6B edges, 28 GB of float16 features) at --scale
   (1 = full size; the default 0.1 keeps the run to a few minutes): wall time, peak RSS, disk.
Each generation runs in its own process (scripts/bench_generate.py), so each peak RSS is its own.
Usage: python scripts/bench_giant_generate.py [--scale 0.1] [--budget 1.5G] [--sweep-nodes 2000000]
       [--sweep-degrees 10,40,80] [--sweep-budget 1G] [--out DIR] [--skip-sweep] [--skip-papers]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).with_name("bench_generate.py")


def generate(preset: str, out: Path, json_path: Path, *options: str) -> dict:
    """Runs bench_generate.py in a child process and returns its JSON result (the graph is deleted after)."""
    command = [sys.executable, str(SCRIPT), preset, "--out", str(out), "--json", str(json_path), "--quiet",
               "--no-load", *options]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(json_path.read_text())


def row(result: dict) -> str:
    stages = result["stage_seconds"]
    return (f"| {result['spec']['num_nodes']:,} | {result['num_edges']:,} | {result['memory_budget_gib']:.2f} | "
            f"{result['sorted_runs']} | {result['generate_seconds']:.1f} | {stages['edges']:.1f} / "
            f"{stages['csc']:.1f} / {stages['save']:.1f} / {stages['features']:.1f} | {result['peak_rss_gib']:.2f} | "
            f"{result['disk_gib']:.2f} | {result['peak_disk_gib']:.2f} |")


HEADER = ("| nodes | edges | budget (GiB) | sorted runs | generate (s) | edges+runs / merge+CSC / save / features (s) "
          "| peak RSS (GiB) | on disk (GiB) | peak disk (GiB) |\n|---|---|---|---|---|---|---|---|---|")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1, help="fraction of papers100m-like's nodes (0.1)")
    parser.add_argument("--budget", default="1.5G", help="memory budget of the papers100m-like run (1.5G: sorted runs "
                        "spill at scale 0.1; the full-size run in BENCHMARKS.md used 5G)")
    parser.add_argument("--sweep-nodes", type=int, default=2_000_000)
    parser.add_argument("--sweep-degrees", default="10,40,80")
    parser.add_argument("--sweep-budget", default="1G")
    parser.add_argument("--out", help="directory for the graphs (default: a temporary one); each is deleted after")
    parser.add_argument("--json", dest="json_path", default="bench_out/bench_giant_generate.json")
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-papers", action="store_true")
    args = parser.parse_args()

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="morphpipe-giant-"))
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {"sweep": [], "papers100m-like": []}
    try:
        if not args.skip_sweep:
            for degree in args.sweep_degrees.split(","):
                results["sweep"].append(generate(
                    "bench-10m", root / f"sweep-{degree}", root / f"sweep-{degree}.json", "--nodes",
                    str(args.sweep_nodes), "--avg-degree", degree, "--memory-budget", args.sweep_budget))
                print(row(results["sweep"][-1]), file=sys.stderr, flush=True)
        if not args.skip_papers:
            results["papers100m-like"].append(generate(
                "papers100m-like", root / "papers", root / "papers.json", "--scale", str(args.scale),
                "--memory-budget", args.budget))
    finally:
        if not args.out:
            shutil.rmtree(root, ignore_errors=True)
    machine = (results["sweep"] or results["papers100m-like"])[0]["machine"]
    print(f"machine: {machine['cpu']}, {machine['logical_cores']} cores, {machine['memory_gib']} GiB; "
          f"load {os.getloadavg()[0]:.1f} at the end")
    if results["sweep"]:
        print(f"\nPeak RSS against the edge count ({args.sweep_nodes:,} nodes, power-law, 128 float16 features, "
              f"budget {args.sweep_budget}):\n\n{HEADER}")
        print("\n".join(row(result) for result in results["sweep"]))
    if results["papers100m-like"]:
        print(f"\npapers100m-like at scale {args.scale} (budget {args.budget}):\n\n{HEADER}")
        print("\n".join(row(result) for result in results["papers100m-like"]))
    Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_path).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
