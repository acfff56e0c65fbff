"""Two parts of a training step, each in its former and its current form side by side, taking turns (issue 23 §3).

- SAGE's destination rows: `h_src[:num_dst]` (backward: a zero-filled `[num_src, F]` tensor, the slice's gradient
  copied in, an add) against `morphpipe.ops.prefix_split.split_prefix` (one in-place add over the prefix rows),
  timed as forward + backward of `agg(h_src) @ W_neigh + h_dst @ W_self` with a group mean standing in for the
  aggregation (its backward gives a fresh full-size gradient, as the fused aggregation's does).
- GAT's per-head projection (`morphpipe.nn.gat.HeadwiseLinear`): a product per head then a copy into the
  strided head slice (former) against BLAS writing the slice itself (`mm(out=)`), forward and backward.

Needs no native build. Prints a markdown table of median milliseconds per form and the speedup.
Usage: python scripts/bench_step_parts.py [--threads 2] [--repeats 15] [--src-rows 60000] [--dst-rows 6000]
         [--width 256] [--gat-rows 60000] [--heads 4] [--gat-in 128] [--gat-out 64]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from morphpipe.nn.gat import HeadwiseLinear
from morphpipe.ops.prefix_split import split_prefix


def sage_rows(h_src: torch.Tensor, num_dst: int, w_neigh: torch.Tensor, w_self: torch.Tensor,
              split: bool) -> Callable[[], None]:
    """Forward + backward of SAGE's two projections with plain slicing or `split_prefix`."""
    def run() -> None:
        h = h_src.detach().requires_grad_()
        h_all, h_dst = split_prefix(h, num_dst) if split else (h, h[:num_dst])
        # A stand-in aggregation: destination i averages sources i * group .. (i + 1) * group - 1; its backward
        # gives a fresh contiguous [num_src, F] gradient, as the fused aggregation's does.
        group = h.shape[0] // num_dst
        neigh = (h_all * (1.0 / group)).view(num_dst, group, h.shape[1]).sum(1)
        ((neigh @ w_neigh.t()) + (h_dst @ w_self.t())).sum().backward()
    return run


def headwise_copy(x: torch.Tensor, weight: torch.Tensor) -> Callable[[], None]:
    """The former HeadwiseLinear: each head's product, then a copy into its slice (forward and backward)."""
    grad = torch.randn(x.shape[0], weight.shape[0], weight.shape[1], dtype=x.dtype)

    def run() -> None:
        out = x.new_empty(x.shape[0], weight.shape[0], weight.shape[1])
        for k in range(weight.shape[0]):
            out[:, k] = x[:, k] @ weight[k].t()
        grad_x = x.new_empty(x.shape)
        for k in range(weight.shape[0]):
            grad_x[:, k] = grad[:, k] @ weight[k]
    return run


def headwise_in_place(x: torch.Tensor, weight: torch.Tensor) -> Callable[[], None]:
    """The current HeadwiseLinear forward and input backward."""
    grad = torch.randn(x.shape[0], weight.shape[0], weight.shape[1], dtype=x.dtype)
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()

    def run() -> None:
        out = HeadwiseLinear.apply(x, weight)
        torch.autograd.grad(out, (x,), grad)
    return run


def median_ms(forms: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each form, the forms taking turns (one untimed round first)."""
    seconds: dict[str, list[float]] = {name: [] for name in forms}
    for round_ in range(repeats + 1):
        for name, run in forms.items():
            start = time.perf_counter()
            run()
            if round_:
                seconds[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(times) for name, times in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--src-rows", type=int, default=60000)
    parser.add_argument("--dst-rows", type=int, default=6000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--gat-rows", type=int, default=60000)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--gat-in", type=int, default=128)
    parser.add_argument("--gat-out", type=int, default=64)
    args = parser.parse_args()
    if args.dst_rows < 1 or args.src_rows % args.dst_rows:
        raise ValueError(f"--src-rows={args.src_rows} must be a multiple of --dst-rows={args.dst_rows} (>= 1): "
                         f"each destination averages its own group of sources")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# {os.cpu_count()} cpus, {args.threads} threads, torch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| part | dtype | shape | former ms | current ms | speedup |")
    print("|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        h_src = torch.randn(args.src_rows, args.width).to(dtype)
        w_neigh, w_self = (torch.randn(args.width, args.width).to(dtype) for _ in range(2))
        times = median_ms({"former": sage_rows(h_src, args.dst_rows, w_neigh, w_self, split=False),
                           "current": sage_rows(h_src, args.dst_rows, w_neigh, w_self, split=True)}, args.repeats)
        print(f"| SAGE destination rows | {str(dtype)[6:]} | src {args.src_rows}, dst {args.dst_rows}, width "
              f"{args.width} | {times['former']:.2f} | {times['current']:.2f} | "
              f"{times['former'] / times['current']:.2f}x |")
        x = torch.randn(args.gat_rows, args.heads, args.gat_in).to(dtype)
        weight = torch.randn(args.heads, args.gat_out, args.gat_in).to(dtype)
        times = median_ms({"former": headwise_copy(x, weight), "current": headwise_in_place(x, weight)},
                          args.repeats)
        print(f"| GAT per-head projection | {str(dtype)[6:]} | rows {args.gat_rows}, {args.heads} heads, "
              f"{args.gat_in} -> {args.gat_out} | {times['former']:.2f} | {times['current']:.2f} | "
              f"{times['former'] / times['current']:.2f}x |")


if __name__ == "__main__":
    main()
