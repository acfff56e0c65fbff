"""The non-zeros of a dense matrix as a CSR Block: the sparse input transform runs on it, the cost model times it.

It sits below both so that the cost model can measure the conversion without importing the ops it prices.
"""
from __future__ import annotations

import torch
from torch import Tensor

from morphpipe import native
from morphpipe.sampling.minibatch import Block


def dense_to_csr(x: Tensor) -> tuple[Block, Tensor]:
    """The non-zeros of 2-D `x` (no gradient) as a Block (rows = x's rows, sources = its columns) and their values."""
    if x.device.type == "cpu":
        indptr, cols, values = native.ops().dense_to_csr(x.contiguous())
        return Block(indptr, cols, x.shape[1], x.shape[0]), values
    mask = x != 0
    indptr = torch.zeros(x.shape[0] + 1, dtype=torch.int64, device=x.device)
    torch.cumsum(mask.sum(1), 0, out=indptr[1:])
    rows, cols = mask.nonzero(as_tuple=True)
    return Block(indptr, cols, x.shape[1], x.shape[0]), x[rows, cols]
