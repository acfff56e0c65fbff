"""Checks of batcher arguments at the Python boundary, so bad input fails with a named fix."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from morphpipe.numeric import check_int

# A batch holds fewer than 2**31 nodes (the samplers' limit), so no larger fanout can mean anything.
MAX_FANOUT = 2**31 - 1


def check_fanouts(fanouts: Sequence[int]) -> list[int]:
    """Fanouts per hop from the seeds: each a positive count, or -1 for all neighbours."""
    if isinstance(fanouts, (str, bytes)) or not isinstance(fanouts, Sequence) or len(fanouts) == 0:
        raise ValueError(f"fanouts: expected a non-empty list of ints such as [15, 10, 5], got {fanouts!r}")
    checked = []
    for hop, fanout in enumerate(fanouts):
        if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)) or (fanout != -1 and fanout <= 0):
            raise ValueError(
                f"fanouts[{hop}] = {fanout!r}: each fanout is a positive neighbour count or -1 for all neighbours"
            )
        if fanout > MAX_FANOUT:
            raise ValueError(f"fanouts[{hop}] = {fanout}: more than the largest fanout {MAX_FANOUT} (2**31 - 1); "
                             "use -1 to take all neighbours")
        checked.append(int(fanout))
    return checked


def check_positive(name: str, value: int) -> int:
    """`value` as an int in [1, 2**63) (what the native ops take), or a ValueError naming `name`."""
    return check_int(name, value, 1)


def check_seed_ids(seeds: torch.Tensor | np.ndarray | Sequence[int], num_nodes: int, name: str = "seeds",
                   unit: str = "node") -> torch.Tensor:
    """Seed ids (of nodes, or of another `unit` such as training edges) as a 1-D int64 tensor, each in
    [0, num_nodes) and none repeated."""
    tensor = seeds if isinstance(seeds, torch.Tensor) else _integer_array(seeds, name, unit)
    if tensor.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D list of {unit} ids, got shape {tuple(tensor.shape)}")
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool or tensor.is_complex():
        raise ValueError(f"{name}: expected integer {unit} ids, got dtype {tensor.dtype}")
    tensor = tensor.to(torch.int64).contiguous()
    if tensor.numel() == 0:
        raise ValueError(f"{name}: no seed {unit}s given; pass at least one {unit} id")
    low, high = int(tensor.min()), int(tensor.max())
    if low < 0 or high >= num_nodes:
        bad = low if low < 0 else high
        raise ValueError(f"{name}: {unit} id {bad} is outside [0, {num_nodes}); pass ids of {unit}s in the graph")
    if torch.unique(tensor).numel() != tensor.numel():
        raise ValueError(f"{name}: contains repeated {unit} ids; each seed must appear once (use torch.unique)")
    return tensor


def _integer_array(seeds: object, name: str, unit: str = "node") -> torch.Tensor:
    """A tensor from a numpy array or a list of node ids; strings, None, objects and ragged lists are refused."""
    if isinstance(seeds, (str, bytes)) or seeds is None:
        raise ValueError(f"{name}: expected a list or tensor of integer {unit} ids, got {type(seeds).__name__} "
                         f"{seeds!r}")
    try:
        array = np.asarray(seeds)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{name}: expected a flat list of integer {unit} ids ({error})") from error
    if array.dtype.kind not in "iufb":
        bad = next((value for value in array.reshape(-1).tolist()
                    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer))), None)
        raise ValueError(f"{name}: expected integer {unit} ids, got {type(bad).__name__} {bad!r} "
                         f"(numpy dtype {array.dtype}); pass ints, e.g. [0, 5, 7]")
    if array.dtype.kind == "u":
        array = array.astype(np.int64)  # a uint64 id past 2**63 wraps negative and is refused as out of range
    return torch.from_numpy(np.ascontiguousarray(array))
