"""Community decomposition of a whole-graph layer (AdaptGear): dense intra-community blocks + a sparse remainder.

Nodes are partitioned into communities of at most `size` nodes (METIS through the optional
`pymetis` package, k-way once into communities of 64 nodes, bisected for 32 and 16; else
communities grown breadth-first), and renumbered by community: node `v`
takes slot `community(v) * size + position`, so every community owns one `size`-row stretch of a
padded table. The adjacency splits into the edges inside a community, held as one dense
`[size, size]` block per community and multiplied by one batched GEMM (`torch.bmm`), and the
edges between communities, left to the CSR kernel as a whole-graph Block. Both parts go through
autograd (index copies, `bmm`, and the CSR kernel's own backward), so the decomposed sum
trains as the plain one does.

The partition is the expensive part: it is computed once per graph and community size and
cached on disk (`<cache>/communities/<fingerprint>-<method>-s<size>.npy`, written atomically),
keyed by a fingerprint of the graph's CSC arrays. The dense blocks and the remainder are
rebuilt from it in vectorised torch.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse
import torch
from torch import Tensor

from morphpipe.ops.reference import accumulate_dtype
from morphpipe.sampling.minibatch import Block

log = logging.getLogger("morphpipe.ops")

METIS = "metis"
BFS = "bfs"
METHODS = (METIS, BFS)
METIS_TOP_SIZE = 64  # the community size k-way METIS partitions into; smaller sizes bisect its communities
CACHE_DIR_ENV = "MORPHPIPE_COMMUNITY_CACHE"
_warned_no_metis: list[bool] = []


def metis_available() -> bool:
    """Whether the optional `pymetis` package (extra `morphpipe[metis]`) can be imported."""
    try:
        import pymetis  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_method(method: str) -> str:
    """`"auto"` as METIS when pymetis is installed, else breadth-first growth (said once); other names checked."""
    if method == "auto":
        if metis_available():
            return METIS
        if not _warned_no_metis:
            _warned_no_metis.append(True)
            log.warning("pymetis is not installed (pip install 'morphpipe[metis]'); communities are grown "
                        "breadth-first instead, which usually keeps fewer edges inside communities")
        return BFS
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not a partitioner; use 'auto' or one of {list(METHODS)}")
    if method == METIS and not metis_available():
        raise ValueError("method='metis' needs the pymetis package; install it with pip install 'morphpipe[metis]' "
                         "or pass method='bfs'")
    return method


def graph_fingerprint(indptr: Tensor, indices: Tensor) -> str:
    """Hex digest of a CSC structure (sizes, index dtype and contents): the key of every per-graph cache."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{indptr.numel()}:{indices.numel()}:".encode())
    for tensor in (indptr.to(torch.int64), indices.to(torch.int64)):
        digest.update(np.ascontiguousarray(tensor.detach().cpu().numpy()).view(np.uint8))
    return digest.hexdigest()


def _symmetric_adjacency(indptr: Tensor, indices: Tensor, num_nodes: int) -> scipy.sparse.csr_matrix:
    """Undirected, loop-free, unweighted adjacency (what METIS and the BFS growth read)."""
    data = np.ones(indices.numel(), dtype=np.int8)
    csc = scipy.sparse.csc_matrix((data, indices.cpu().numpy(), indptr.cpu().numpy()), shape=(num_nodes, num_nodes))
    both = (csc + csc.T).tocsr()
    both.setdiag(0)
    both.eliminate_zeros()
    both.sort_indices()
    return both


def _metis_parts(adjacency: scipy.sparse.csr_matrix, num_parts: int) -> np.ndarray:
    """METIS k-way membership (one part per node)."""
    import pymetis

    xadj = adjacency.indptr.astype(np.int64)
    adjncy = adjacency.indices.astype(np.int64)
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2
        _, membership = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy))
    else:
        _, membership = pymetis.part_graph(num_parts, xadj=xadj, adjncy=adjncy)
    return np.asarray(membership, dtype=np.int64)


def _bfs_parts(adjacency: scipy.sparse.csr_matrix, size: int) -> np.ndarray:
    """Communities grown breadth-first from the lowest unassigned node until `size` nodes (the METIS fallback)."""
    num_nodes = adjacency.shape[0]
    indptr, indices = adjacency.indptr, adjacency.indices
    community = [-1] * num_nodes
    next_id = 0
    for start in range(num_nodes):
        if community[start] >= 0:
            continue
        community[start] = next_id
        members = [start]
        head = 0
        while head < len(members) and len(members) < size:
            node = members[head]
            head += 1
            for neighbour in indices[indptr[node]:indptr[node + 1]].tolist():
                if community[neighbour] < 0:
                    community[neighbour] = next_id
                    members.append(neighbour)
                    if len(members) == size:
                        break
        next_id += 1
    return np.asarray(community, dtype=np.int64)


def bisect_communities(adjacency: scipy.sparse.csr_matrix, membership: np.ndarray, size: int) -> np.ndarray:
    """Every community of more than `size` nodes cut in two by METIS on its own subgraph (recursive bisection
    one level down): the communities of twice the size, refined without partitioning the whole graph again."""
    order = np.argsort(membership, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(membership))]
    out = np.empty_like(membership)
    for community in range(bounds.size - 1):
        nodes = order[bounds[community]:bounds[community + 1]]
        half = np.zeros(nodes.size, dtype=np.int64)
        if nodes.size > size:
            inside = adjacency[nodes][:, nodes]
            half = _metis_parts(inside, 2) if inside.nnz else (np.arange(nodes.size) >= nodes.size // 2).astype(np.int64)
        out[nodes] = 2 * community + half
    return out


def split_large(membership: np.ndarray, size: int) -> np.ndarray:
    """Parts cut into pieces of at most `size` nodes (in node order), renumbered 0..C-1 without gaps."""
    if membership.size == 0:
        return membership.astype(np.int64)
    order = np.argsort(membership, kind="stable")
    sorted_parts = membership[order]
    starts = np.flatnonzero(np.r_[True, sorted_parts[1:] != sorted_parts[:-1]])
    lengths = np.diff(np.r_[starts, sorted_parts.size])
    rank = np.arange(sorted_parts.size) - np.repeat(starts, lengths)
    piece = np.repeat(np.arange(starts.size), lengths) * (int(lengths.max() - 1) // size + 1) + rank // size
    _, compact = np.unique(piece, return_inverse=True)
    out = np.empty_like(membership, dtype=np.int64)
    out[order] = compact
    return out


def partition(indptr: Tensor, indices: Tensor, num_nodes: int, size: int, method: str = "auto",
              refine_from: Callable[..., tuple[np.ndarray, str]] | None = None) -> tuple[np.ndarray, str]:
    """Community of every node (communities of at most `size` nodes, ids 0..C-1) and the method that made it.

    METIS partitions the whole graph once, k-way into communities of `METIS_TOP_SIZE` (or of `size`
    when larger); a smaller size bisects each community of twice its size (`bisect_communities`),
    taken from `refine_from` (the cache) when given. K-way METIS into tens of thousands of parts
    is the slow step, so it runs once for all the selector's sizes.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"community size must be an int >= 1, got {size!r}")
    method = resolve_method(method)
    if num_nodes == 0:
        return np.zeros(0, dtype=np.int64), method
    num_parts = math.ceil(num_nodes / size)
    adjacency = _symmetric_adjacency(indptr, indices, num_nodes)
    if num_parts == 1:
        membership = np.zeros(num_nodes, dtype=np.int64)
    elif size == 1:
        membership = np.arange(num_nodes, dtype=np.int64)
    elif method == METIS and adjacency.nnz > 0 and 2 * size <= METIS_TOP_SIZE:
        double, _ = (refine_from or partition)(indptr, indices, num_nodes, 2 * size, method)
        membership = bisect_communities(adjacency, double, size)
    elif method == METIS and adjacency.nnz > 0:
        membership = _metis_parts(adjacency, num_parts)
    else:
        membership = _bfs_parts(adjacency, size)
    return split_large(membership, size), method


def default_cache_dir() -> Path:
    """$MORPHPIPE_COMMUNITY_CACHE, else `communities/` in the dataset cache (beside the datasets)."""
    from morphpipe.data.store import data_root

    chosen = os.environ.get(CACHE_DIR_ENV)
    return Path(chosen).expanduser() if chosen else data_root() / "communities"


def cached_partition(indptr: Tensor, indices: Tensor, num_nodes: int, size: int, method: str = "auto",
                     cache_dir: str | os.PathLike | None = None, fingerprint: str | None = None) -> tuple[np.ndarray, str]:
    """`partition`, read from / written to the on-disk cache (atomic replace, so readers never see half a file)."""
    method = resolve_method(method)
    fingerprint = fingerprint or graph_fingerprint(indptr, indices)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = folder / f"{fingerprint}-{method}-s{size}.npy"
    if path.exists():
        try:
            membership = np.load(path)
            if membership.shape == (num_nodes,) and membership.dtype == np.int64:
                return membership, method
        except (OSError, ValueError):
            pass
        log.warning("community cache %s is unreadable or for another graph; recomputing it", path)
    log.info("partitioning %d nodes into communities of at most %d nodes (%s), once per graph; cached at %s",
             num_nodes, size, method, path)

    def from_cache(*args: object) -> tuple[np.ndarray, str]:
        return cached_partition(*args, cache_dir=folder, fingerprint=fingerprint)

    membership, method = partition(indptr, indices, num_nodes, size, method, refine_from=from_cache)
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{path.name}.{os.getpid()}.tmp"
    with open(temporary, "wb") as handle:
        np.save(handle, membership)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return membership, method


@dataclass
class Decomposition:
    """One whole-graph layer split by communities of at most `size` nodes: dense diagonal blocks + a CSR remainder.

    `slot[v]` is node v's row in the padded community-ordered table (`num_communities * size` rows);
    `gather[r]` the node in row r of that table (node 0 in the `padding` rows, which are zeroed);
    `block_entries` the flat `[C * size * size]` position of every intra-community edge (duplicates
    repeat); `inter` the whole-graph Block of the edges between communities.
    """

    size: int
    num_communities: int
    method: str
    slot: Tensor
    gather: Tensor
    padding: Tensor
    block_entries: Tensor
    inter: Block
    _dense: dict[tuple[torch.dtype, str], Tensor] = field(default_factory=dict, repr=False)

    @property
    def num_nodes(self) -> int:
        return int(self.slot.numel())

    @property
    def intra_edges(self) -> int:
        return int(self.block_entries.numel())

    @property
    def inter_edges(self) -> int:
        return self.inter.nnz

    def intra_fraction(self) -> float:
        """Share of the edges that the dense blocks hold."""
        total = self.intra_edges + self.inter_edges
        return self.intra_edges / total if total else 0.0

    def blocks(self, dtype: torch.dtype, device: torch.device, self_loop: bool = False) -> Tensor:
        """Dense `[C, size, size]` intra-community adjacency (edge counts, plus one on the diagonal of every node
        with `self_loop`) in `dtype` on `device`, built once."""
        key = ("loops" if self_loop else "edges", dtype, str(device))
        if key not in self._dense:
            entries = self.block_entries.to(device)
            if self_loop:
                slot = self.slot.to(device)
                entries = torch.cat([entries, slot * self.size + slot % self.size])
            flat = torch.zeros(self.num_communities * self.size * self.size, dtype=dtype, device=device)
            flat.index_put_((entries,), torch.ones(entries.numel(), dtype=dtype, device=device), accumulate=True)
            self._dense[key] = flat.view(self.num_communities, self.size, self.size)
        return self._dense[key]

    def scaled_blocks(self, dtype: torch.dtype, device: torch.device, src_scale: Tensor | None,
                      dst_scale: Tensor | None, self_loop: bool, scale_key: str | None = None) -> Tensor:
        """`diag(dst_scale) (blocks [+ I]) diag(src_scale)` per community; kept under `scale_key` when given."""
        key = (f"scaled:{scale_key}:{self_loop}", dtype, str(device))
        if scale_key is not None and key in self._dense:
            return self._dense[key]
        blocks = self.blocks(dtype, device, self_loop)
        gather = self.gather.to(device)
        if dst_scale is not None:
            blocks = blocks * dst_scale.to(dtype)[gather].view(self.num_communities, self.size, 1)
        if src_scale is not None:
            blocks = blocks * src_scale.to(dtype)[gather].view(self.num_communities, 1, self.size)
        if scale_key is not None:
            self._dense[key] = blocks
        return blocks

    def to(self, device: torch.device) -> Decomposition:
        """This decomposition's index tensors on `device` (dense blocks are built there on first use)."""
        if self.slot.device == device:
            return self
        return Decomposition(self.size, self.num_communities, self.method, self.slot.to(device),
                             self.gather.to(device), self.padding.to(device), self.block_entries.to(device),
                             self.inter.to(device))


def decompose(block: Block, membership: np.ndarray, size: int, method: str) -> Decomposition:
    """Split a square `block`'s edges by `membership` (communities of at most `size` nodes, ids 0..C-1)."""
    if block.num_src != block.num_dst:
        raise ValueError(f"a community decomposition needs a whole-graph block (num_src == num_dst), got "
                         f"num_src={block.num_src}, num_dst={block.num_dst}")
    num_nodes = block.num_dst
    community = torch.from_numpy(membership).to(block.device)
    num_communities = int(community.max()) + 1 if num_nodes else 0
    order = torch.argsort(community, stable=True)
    counts = torch.bincount(community, minlength=num_communities)
    if num_nodes and int(counts.max()) > size:
        raise ValueError(f"membership has a community of {int(counts.max())} nodes, more than size={size}")
    starts = torch.cumsum(counts, 0) - counts
    position = torch.empty_like(order)
    position[order] = torch.arange(num_nodes, device=block.device) - starts[community[order]]
    slot = community * size + position
    gather = torch.zeros(num_communities * size, dtype=torch.int64, device=block.device)
    gather[slot] = torch.arange(num_nodes, device=block.device)
    filled = torch.zeros(num_communities * size, dtype=torch.bool, device=block.device)
    filled[slot] = True
    padding = torch.nonzero(~filled).flatten()
    dst = torch.repeat_interleave(torch.arange(num_nodes, device=block.device), block.indptr[1:] - block.indptr[:-1],
                                  output_size=block.nnz)
    src = block.indices
    inside = community[dst] == community[src]
    block_entries = community[dst[inside]] * size * size + position[dst[inside]] * size + position[src[inside]]
    outside = ~inside
    inter_indptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=block.device)
    inter_indptr[1:] = torch.cumsum(torch.bincount(dst[outside], minlength=num_nodes), 0)
    inter = Block(inter_indptr, src[outside].contiguous(), num_nodes, num_nodes)
    return Decomposition(size, num_communities, method, slot, gather, padding, block_entries, inter)


def decomposed_sum(decomposition: Decomposition, x: Tensor, src_scale: Tensor | None, dst_scale: Tensor | None,
                   self_loop: bool, inter_sum: Callable[[Block, Tensor, Tensor | None, Tensor | None], Tensor],
                   scale_key: str | None = None) -> Tensor:
    """`dst_scale * (A (src_scale * x) + [self_loop] src_scale * x)` as dense blocks (bmm) + `inter_sum` on the rest.

    The scales and the self loops are folded into the dense blocks, and `inter_sum(block, x,
    src_scale, dst_scale)` (the fused CSR kernel) applies them in-kernel, so `x` is read twice
    and the output written once. `scale_key` names scales that are a function of the structure
    alone (e.g. "mean", "gcn"): the folded blocks are then kept for the next call. Autograd
    differentiates the whole expression; the scales are constants.
    """
    acc = accumulate_dtype(x.dtype)
    size, communities, width = decomposition.size, decomposition.num_communities, x.shape[1]
    blocks = decomposition.scaled_blocks(acc, x.device, src_scale, dst_scale, self_loop, scale_key)
    padded = x.index_select(0, decomposition.gather)
    if decomposition.padding.numel():
        padded = padded.index_fill(0, decomposition.padding, 0)
    intra = torch.bmm(blocks, padded.to(acc).view(communities, size, width))
    out = intra.view(communities * size, width).index_select(0, decomposition.slot)
    if decomposition.inter_edges:
        out = out + inter_sum(decomposition.inter, x, src_scale, dst_scale)
    return out.to(x.dtype)


@dataclass
class GraphBlock(Block):
    """A whole-graph layer (`num_src == num_dst`) that can be community-decomposed; decompositions built once.

    Made by `GraphBlock.of(indptr, indices)`; `cache_dir` is where partitions are cached (None:
    `default_cache_dir()`), `method` the partitioner ("auto", "metis", "bfs").
    """

    fingerprint: str = ""
    cache_dir: Path | None = None
    method: str = "auto"
    decompositions: dict[int, Decomposition] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, indptr: Tensor, indices: Tensor, *, cache_dir: str | os.PathLike | None = None,
           method: str = "auto") -> GraphBlock:
        """The whole graph of CSC `indptr` / `indices` (any integer dtype) as one square layer."""
        num_nodes = indptr.numel() - 1
        return cls(indptr.to(torch.int64), indices.to(torch.int64), num_nodes, num_nodes,
                   fingerprint=graph_fingerprint(indptr, indices),
                   cache_dir=Path(cache_dir) if cache_dir is not None else None, method=method)

    def decomposition(self, size: int) -> Decomposition:
        """The decomposition into communities of at most `size` nodes (partition from the cache, else computed)."""
        if size not in self.decompositions:
            cpu = self.to("cpu")
            membership, method = cached_partition(cpu.indptr, cpu.indices, self.num_dst, size, self.method,
                                                  self.cache_dir, self.fingerprint)
            decomposition = decompose(cpu, membership, size, method).to(self.device)
            log.info("community decomposition s%d (%s): %d communities, %.1f%% of %d edges inside them",
                     size, method, decomposition.num_communities, 100 * decomposition.intra_fraction(), self.nnz)
            self.decompositions[size] = decomposition
        return self.decompositions[size]

    def _map(self, tensor_fn) -> Block:
        moved = super()._map(tensor_fn)
        return GraphBlock(moved.indptr, moved.indices, self.num_src, self.num_dst, moved.src_degrees,
                          fingerprint=self.fingerprint, cache_dir=self.cache_dir, method=self.method,
                          decompositions={size: d.to(moved.device) for size, d in self.decompositions.items()})
