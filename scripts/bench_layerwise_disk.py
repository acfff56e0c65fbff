"""Exact layer-wise inference at scale: all in RAM, against features and tables on disk, alone and under a memory limit.

On one graph and one model saved by `morphpipe train --checkpoint-dir`, one layer-wise pass for the seeds of every
split (what `morphpipe evaluate --split all` runs), each configuration in a child process of its own:

- `ram`: the features memory-mapped as GraphStore.load maps them, the intermediate tables in memory (a budget of
  --ram-budget);
- `disk`: the features read through the feature store (--feature-cache-mb of hot rows cached), the tables over
  --memory-budget written to .npy files in --tmp-dir and read back through feature stores;
- `cgroup`: as `disk`, inside a cgroup-v1 memory group (/sys/fs/cgroup/memory; needs root) limited to --limit
  (default: half the `ram` child's peak RSS), so that the page cache cannot hold what the pass reads.

The page cache is dropped before each child (root). Each child reports the accuracies, the wall time of the pass,
its peak RSS (VmHWM, reset before the pass) and the peaks of its anonymous and file-mapped parts (sampled every
50 ms), the bytes it read from and wrote to storage (/proc/self/io), the group's peak usage (cgroup), and every
layer's time split into building blocks, reading rows, computing and writing (LayerStats), with the reads and
bytes asked of the feature stores (from the page cache or the disk). The children's predictions and logits are
compared with the first child's (chunks of other sizes sum in other orders). Prints markdown tables, writes JSON.
Not a test.

  morphpipe train bench-1m --model sage --hidden 256 --fanouts 10,10,10 --epochs 1 --checkpoint-dir ckpt
  python scripts/bench_layerwise_disk.py bench-1m --checkpoint ckpt --limit 1200M,900M
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_giant import CGROUP_ROOT, drop_page_cache

MODES = ("ram", "disk", "cgroup")


def byte_size(text: str) -> int:
    """6G, 512M, 64K or bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    scale = units.get(text[-1:].upper(), 1)
    try:
        value = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a size such as 256M or 2G, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("dataset", help="preset name or graph directory (the one the checkpoint was trained on)")
    parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory of `morphpipe train`")
    parser.add_argument("--modes", default=",".join(MODES), help=f"which configurations, in order (default: "
                                                                  f"{','.join(MODES)})")
    parser.add_argument("--memory-budget", type=byte_size, default=256 << 20,
                        help="layer-wise memory budget of the disk configurations (default 256M)")
    parser.add_argument("--ram-budget", type=byte_size, default=8 << 30,
                        help="layer-wise memory budget of `ram` (default 8G: every table in memory)")
    parser.add_argument("--feature-cache-mb", type=float, default=0.0,
                        help="feature store cache of the disk configurations in MB (default 0)")
    parser.add_argument("--limit", type=lambda text: [byte_size(part) for part in text.split(",")], default=None,
                        help="the memory group's limit for `cgroup`, or several (900M,1200M: one `cgroup` run each) "
                             "(default: half the `ram` child's peak RSS)")
    parser.add_argument("--chunk-size", type=int, default=None, help="destinations per chunk (default: from the "
                                                                     "budget)")
    parser.add_argument("--tmp-dir", type=Path, default=None, help="where the tables on disk go (default: the "
                                                                     "system's temporary directory)")
    parser.add_argument("--json", type=Path, default=Path("bench_layerwise_disk.json"), help="JSON output")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--logits", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args)
    return parent(args)


def parent(args) -> int:
    import torch

    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        print(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    if "cgroup" in modes and (os.geteuid() != 0 or not (CGROUP_ROOT / "memory.limit_in_bytes").exists()):
        print(f"--modes cgroup needs root and the cgroup v1 memory controller at {CGROUP_ROOT}", file=sys.stderr)
        return 2
    if "cgroup" in modes and args.limit is None and "ram" not in modes[:modes.index("cgroup")]:
        print("--modes cgroup: give --limit, or run ram before it (the limit defaults to half its peak RSS)",
              file=sys.stderr)
        return 2
    cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    print(f"{args.dataset}, checkpoint {args.checkpoint}; cpu {cpu}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results, logits = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-layerwise-") as scratch:
        runs = [(mode, limit) for mode in modes for limit in (args.limit or [None] if mode == "cgroup" else [None])]
        for run, (mode, limit) in enumerate(runs):
            dropped = drop_page_cache()
            if mode == "cgroup" and limit is None:
                ram = next((r for r in results if r["mode"] == "ram" and "failed" not in r), None)
                limit = ram["peak_rss"] // 2 if ram else None
                if limit is None:
                    print("cgroup: no limit (the ram child failed and --limit was not given); skipped", flush=True)
                    continue
            out = Path(scratch) / f"{run}-{mode}.pt"
            command = [sys.executable, __file__, args.dataset, "--checkpoint", str(args.checkpoint), "--child", mode,
                       "--logits", str(out), "--memory-budget", str(args.memory_budget),
                       "--ram-budget", str(args.ram_budget), "--feature-cache-mb", str(args.feature_cache_mb)] + \
                (["--chunk-size", str(args.chunk_size)] if args.chunk_size else []) + \
                (["--tmp-dir", str(args.tmp_dir)] if args.tmp_dir else []) + \
                (["--limit", str(limit)] if limit else [])
            result = run_child(command, mode, limit)
            result["page_cache_dropped"] = dropped
            results.append(result)
            if "failed" in result:
                print(f"{mode}: child failed ({result['failed']}):\n{result['stderr']}", flush=True)
                continue
            logits[run] = torch.load(out)
            result["run"] = run
            print(summary(result), flush=True)
    reference = next(iter(logits), None)
    for result in results:  # chunks of other sizes sum in other orders: equal predictions, logits within rounding
        if result.get("run") in logits and reference is not None:
            mine, theirs = logits[result["run"]], logits[reference]
            result["compared_to"] = runs[reference][0]
            result["logits_bit_equal"] = torch.equal(mine.view(torch.int32), theirs.view(torch.int32))
            result["logits_max_abs_diff"] = float((mine - theirs).abs().max())
            result["predictions_equal"] = torch.equal(mine.argmax(1), theirs.argmax(1))
    print()
    print(table(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"dataset": args.dataset, "checkpoint": str(args.checkpoint), "cpu": cpu,
                                     "load_end": os.getloadavg(), "settings": vars(args), "results": results},
                                    indent=2, default=str))
    print(f"wrote {args.json}")
    return 0


def run_child(command: list[str], mode: str, limit: int | None) -> dict:
    """Runs one configuration (in a memory group limited to `limit` when given); its JSON result."""
    group = None
    if limit is not None:
        group = CGROUP_ROOT / f"morphpipe-bench-layerwise-{os.getpid()}-{mode}-{limit}"
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(f"{limit}\n")
    process = None
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=None if sys.stderr.isatty() else
                                   subprocess.PIPE, text=True,
                                   preexec_fn=None if group is None else
                                   (lambda: (group / "cgroup.procs").write_text(f"{os.getpid()}\n")))
        stdout, stderr = process.communicate()
        group_peak = int((group / "memory.max_usage_in_bytes").read_text()) if group is not None else None
        failcnt = int((group / "memory.failcnt").read_text()) if group is not None else None
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if group is not None:
            group.rmdir()
    if process.returncode != 0:
        return {"mode": mode, "failed": process.returncode, "stderr": (stderr or "")[-3000:], "limit": limit}
    result = json.loads(stdout.strip().splitlines()[-1])
    result.update(limit=limit, group_peak=group_peak, group_failcnt=failcnt)
    return result


def proc_io() -> dict[str, int]:
    """This process's storage I/O counters."""
    return {key: int(value) for key, value in (line.split(": ") for line in open("/proc/self/io"))}


def status_kb(*keys: str) -> dict[str, int]:
    """Fields of /proc/self/status in bytes."""
    values = {}
    for line in open("/proc/self/status"):
        key, _, rest = line.partition(":")
        if key in keys:
            values[key] = int(rest.split()[0]) * 1024
    return values


def child(args) -> int:
    import torch

    from morphpipe.commands.workload import model_from_spec
    from morphpipe.data import load_dataset
    from morphpipe.executor.checkpoint import load_checkpoint
    from morphpipe.nn.layerwise import LayerStats, layerwise_inference

    mode = args.child
    on_disk = mode != "ram"
    graph = load_dataset(args.dataset, features_on_disk=on_disk,
                         feature_cache_bytes=int(args.feature_cache_mb * 1e6) if on_disk else 0)
    state = load_checkpoint(args.checkpoint)
    model = model_from_spec(state.meta["model_spec"])
    model.load_state_dict(state.model)
    splits = {split: getattr(graph, f"{split}_idx") for split in ("train", "val", "test")}
    seeds = torch.cat(list(splits.values()))
    stats: list[LayerStats] = []
    messages: list[str] = []
    peaks = {"RssAnon": 0, "RssFile": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            for key, value in status_kb("RssAnon", "RssFile").items():
                peaks[key] = max(peaks[key], value)

    Path("/proc/self/clear_refs").write_text("5\n")  # resets VmHWM to the RSS now
    before_rss = status_kb("VmRSS")["VmRSS"]
    io_before = proc_io()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    cpu_before = os.times()
    logits = layerwise_inference(model, graph, seeds, chunk_size=args.chunk_size,
                                 memory_budget=args.memory_budget if on_disk else args.ram_budget,
                                 tmp_dir=args.tmp_dir, progress=True, log=messages.append, stats=stats)
    seconds = time.perf_counter() - started
    cpu_after = os.times()
    done.set()
    sampler.join()
    io_after = proc_io()
    correct = logits.argmax(dim=1) == graph.labels[seeds]
    accuracies, start = {}, 0
    for name, split in splits.items():
        accuracies[name] = int(correct[start:start + split.numel()].sum()) / split.numel()
        start += split.numel()
    torch.save(logits, args.logits)
    store = getattr(graph, "feature_store", None)
    print(json.dumps({
        "mode": mode, "seconds": seconds,
        "cpu_seconds": (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system),
        "accuracy": accuracies, "seeds": int(seeds.numel()),
        "memory_budget": args.memory_budget if on_disk else args.ram_budget,
        "rss_before": before_rss, "peak_rss": status_kb("VmHWM")["VmHWM"],
        "peak_rss_anon": peaks["RssAnon"], "peak_rss_file": peaks["RssFile"],
        "read_bytes": io_after["read_bytes"] - io_before["read_bytes"],
        "write_bytes": io_after["write_bytes"] - io_before["write_bytes"],
        "feature_cache_bytes": store.cache_bytes if store is not None else None,
        "layers": [vars(layer) for layer in stats], "log": messages,
    }), flush=True)
    return 0


def summary(result: dict) -> str:
    mb = 1e6
    return (f"{result['mode']}: {result['seconds']:.1f} s, peak RSS {result['peak_rss'] / mb:,.0f} MB "
            f"(anon {result['peak_rss_anon'] / mb:,.0f}, file {result['peak_rss_file'] / mb:,.0f}), read "
            f"{result['read_bytes'] / mb:,.0f} MB, wrote {result['write_bytes'] / mb:,.0f} MB; accuracy "
            + ", ".join(f"{k} {v:.4f}" for k, v in result["accuracy"].items()))


def table(results: list[dict]) -> str:
    mb = 1e6
    lines = ["| mode | budget MB | limit MB | wall s | CPU s | RSS before MB | peak RSS MB (anon / file) | group peak MB | read MB | "
             "written MB | train / val / test acc | same predictions / max logit diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['mode']} | | {(r['limit'] or 0) / mb:,.0f} | failed ({r['failed']}) | | | | | | | | |")
            continue
        equal = f"{r['predictions_equal']} / {r['logits_max_abs_diff']:.1e}" if "compared_to" in r else ""
        lines.append(
            f"| {r['mode']} | {r['memory_budget'] / mb:,.0f} | {r['limit'] / mb if r['limit'] else 0:,.0f} | "
            f"{r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {r['rss_before'] / mb:,.0f} | {r['peak_rss'] / mb:,.0f} ({r['peak_rss_anon'] / mb:,.0f}"
            f" / {r['peak_rss_file'] / mb:,.0f}) | {r['group_peak'] / mb if r['group_peak'] else 0:,.0f} | "
            f"{r['read_bytes'] / mb:,.0f} | {r['write_bytes'] / mb:,.0f} | "
            f"{' / '.join(f'{v:.4f}' for v in r['accuracy'].values())} | {equal} |")
    lines += ["", "| mode | layer | chunks | rows read | wall s | blocks s | reading s | computing s | writing s | "
              "store reads | store MB asked |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for layer in r.get("layers", []):
            disk = "" if layer["store_reads"] is None else f"{layer['store_reads']:,} | {layer['store_bytes'] / mb:,.0f}"
            lines.append(f"| {r['mode']} | {layer['layer'] + 1} | {layer['chunks']} | {layer['rows_read']:,} | "
                         f"{layer['seconds']:.1f} | {layer['build_seconds']:.1f} | {layer['read_seconds']:.1f} | "
                         f"{layer['compute_seconds']:.1f} | {layer['write_seconds']:.1f} | {disk or ' | '} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
