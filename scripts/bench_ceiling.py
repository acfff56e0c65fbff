"""Benchmark: the machine's ceilings for CPU batching and training (issue 23, section 5).

Memory copy bandwidth (STREAM copy, all threads), the random row-gather rate of 256- and 512-byte
rows (all threads, from a table far larger than the caches), and torch `mm`'s float32 and bfloat16
rate at the GEMM shapes of one real SAGE 3x256 training step (batch 1024, fanouts 15,10,5, recorded
forward and backward). Other benchmarks print their figures as shares of these
(`morphpipe.profiler.ceiling`). Not a test.
Usage: python scripts/bench_ceiling.py [--dataset default] [--buffer-mib 1024] [--json ceiling.json]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from morphpipe.data import load_dataset
from morphpipe.profiler.ceiling import isa_flags, measure_gemm, measure_memory_ceiling, training_step_gemm_shapes
from morphpipe.profiler.hardware import HardwareFacts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="default", help="the graph whose first batch gives the GEMM shapes")
    parser.add_argument("--model", default="sage")
    parser.add_argument("--buffer-mib", type=int, default=1024, help="copy buffer and gather table size")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    facts = HardwareFacts.detect()
    threads = torch.get_num_threads()
    print(f"# {facts.cpu_model} ({' '.join(isa_flags())}); {threads} threads; load {os.getloadavg()[0]:.1f}; "
          f"torch {torch.__version__}")
    memory = measure_memory_ceiling(buffer_bytes=args.buffer_mib << 20)
    print("| ceiling | figure |")
    print("|---|---|")
    print(f"| copy bandwidth (read + write) | {memory.copy_gb_per_s:.1f} GB/s |")
    for size, rate in memory.gather_rows_per_s.items():
        print(f"| random {size}-byte row gather | {rate / 1e6:.1f} M rows/s "
              f"({memory.gather_gb_per_s(size):.1f} GB/s) |")
    shapes = training_step_gemm_shapes(load_dataset(args.dataset), args.model)
    gemms = {dtype: measure_gemm(shapes, dtype) for dtype in (torch.float32, torch.bfloat16)}
    for ceiling in gemms.values():
        print(f"| {args.model} step GEMMs, {ceiling.dtype} | {ceiling.gflop_per_s:.0f} GFLOP/s "
              f"({ceiling.seconds * 1e3:.1f} ms for the step's {len(shapes)} shapes) |")
    ratio = gemms[torch.bfloat16].gflop_per_s / gemms[torch.float32].gflop_per_s
    print(f"| bf16 / fp32 GEMM rate | {ratio:.2f}x |")
    print("step GEMM shapes (m x k x n, count): "
          + ", ".join(f"{s.m}x{s.k}x{s.n} x{s.count}" for s in shapes))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"cpu": facts.cpu_model, "cpu_flags": isa_flags(), "threads": threads, "memory": memory.to_dict(),
                       "gemm_shapes": [vars(s) for s in shapes],
                       "gemm": {str(k).removeprefix("torch."): v.to_dict() for k, v in gemms.items()}}, out, indent=2)


if __name__ == "__main__":
    main()
