"""The dtypes a graph store accepts, and how each is stored in a .npy file (numpy has no bfloat16)."""
from __future__ import annotations

import warnings

import numpy as np
import torch

FEATURE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
INDEX_DTYPES: dict[str, torch.dtype] = {"int32": torch.int32, "int64": torch.int64}
# numpy dtype of the .npy file holding each feature dtype; bfloat16 is kept as its raw uint16 bits.
FEATURE_STORAGE: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
}
INT32_LIMIT = 2**31


def dtype_name(dtype: torch.dtype) -> str:
    """'torch.float16' -> 'float16', the spelling used in meta.json and on the command line."""
    return str(dtype).removeprefix("torch.")


def index_dtype_for(num_nodes: int) -> np.dtype:
    """int32 node ids while they fit (half the memory of int64), int64 beyond 2**31 nodes."""
    return np.dtype(np.int32) if num_nodes < INT32_LIMIT else np.dtype(np.int64)


def tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor; bfloat16 comes back as its uint16 bit pattern."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def numpy_view(array: np.ndarray) -> torch.Tensor:
    """Zero-copy tensor over `array`, read-only maps included: the stores never write through them, so torch's
    warning about non-writable arrays would only alarm the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def features_from_storage(array: np.ndarray, name: str) -> torch.Tensor:
    """Zero-copy tensor over stored feature values, reinterpreting the uint16 bits of bfloat16."""
    if name == "bfloat16":
        return numpy_view(array.view(np.int16)).view(torch.bfloat16)
    return numpy_view(array)


def float32_to_storage(values: np.ndarray, name: str, out: np.ndarray | None = None) -> np.ndarray:
    """float32 values converted (round to nearest) to the stored encoding of feature dtype `name`, into `out`."""
    if name == "float32":
        return values
    if out is None:
        out = np.empty(values.shape, dtype=FEATURE_STORAGE[name])
    if name == "float16":
        np.copyto(out, values, casting="same_kind")
    else:
        torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).copy_(torch.from_numpy(values))
    return out
