"""The fused ops' self-check: on a device's first Route 1 use they must match the reference ops there.

`morphpipe.ops` registers it with the Route 1 self-check (`morphpipe.sampling.backend_check`) when
it is imported, so it runs and is recorded beside the sampler kernels' check; where it fails, the
automatic ops backend leaves the fused ops on that device type.
"""
from __future__ import annotations

import torch

from morphpipe.ops import fused
from morphpipe.ops.aggregate import aggregate, exclude_from_auto, gat_attention, gcn_aggregate, use_backend
from morphpipe.sampling.minibatch import Block

NAME = "fused ops"
# Rounding alone moves a float32 sum of at most 8 unit-size terms (or a softmax over them, CUDA's fast-math exp
# included) by about 1e-6; a kernel off by 0.1% (a wrong scale, a dropped or doubled term) is far outside.
OPS_ATOL, OPS_RTOL = 5e-5, 2e-5
WIDTHS = (16, 67)  # feature widths checked: a multiple of every vector width, and an odd one past two warps


def _random_block(device: torch.device, num_dst: int = 40, num_src: int = 100, seed: int = 0) -> Block:
    generator = torch.Generator().manual_seed(seed)
    degrees = torch.randint(0, 9, (num_dst,), generator=generator)
    degrees[3] = 0
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=indptr[1:])
    indices = torch.randint(0, num_src, (int(indptr[-1]),), generator=generator)
    return Block(indptr.to(device), indices.to(device), num_src, num_dst)


def _op_outputs(backend: str, block: Block, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every op's forward output and input gradients under `backend`, on fresh leaves of `inputs`."""
    results: dict[str, torch.Tensor] = {}
    with use_backend(backend):
        for name, run in (
            ("sum", lambda t: aggregate(block, t["h"], "sum", t["w"])),
            ("mean", lambda t: aggregate(block, t["h"], "mean")),
            ("max", lambda t: aggregate(block, t["h"], "max")),
            ("gcn", lambda t: gcn_aggregate(block, t["h"])),
            ("gat", lambda t: gat_attention(block, t["h3"], t["s_src"], t["s_dst"])),
        ):
            leaves = {key: value.detach().clone().requires_grad_(True) for key, value in inputs.items()}
            out = run(leaves)
            out.backward(torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out))
            results[f"{name} forward"] = out.detach()
            for key, leaf in leaves.items():
                if leaf.grad is not None:
                    results[f"{name} grad {key}"] = leaf.grad
    return results


def ops_problem(device: torch.device, candidate: str = fused.NAME, reference: str = "reference") -> str | None:
    """Where the `candidate` ops backend differs from `reference` on `device` beyond tolerance, or None."""
    try:
        block = _random_block(device)
        generator = torch.Generator().manual_seed(1)

        def draw(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator).to(device)

        for width in WIDTHS:
            inputs = {"h": draw(block.num_src, width), "w": draw(block.nnz), "h3": draw(block.num_src, 2, width // 2),
                      "s_src": draw(block.num_src, 2), "s_dst": draw(block.num_dst, 2)}
            ours, theirs = _op_outputs(candidate, block, inputs), _op_outputs(reference, block, inputs)
            for key, expected in theirs.items():
                got = ours.get(key)
                if got is None or got.shape != expected.shape:
                    return f"width {width}: {key}: missing or shaped {None if got is None else tuple(got.shape)}"
                if not torch.allclose(got.float(), expected.float(), atol=OPS_ATOL, rtol=OPS_RTOL):
                    worst = float((got.float() - expected.float()).abs().max())
                    return f"width {width}: {key} differs from the {reference} backend by up to {worst:.3g}"
        return None
    except Exception as error:  # noqa: BLE001 - any failure of the candidate is the verdict
        return f"raised {type(error).__name__}: {error}"


def leave_auto(device_type: str, problem: str) -> None:
    """Acts on a failed check: the automatic ops backend no longer picks the fused ops on `device_type`."""
    exclude_from_auto(fused.NAME, device_type, f"the self-check failed: {problem}")
