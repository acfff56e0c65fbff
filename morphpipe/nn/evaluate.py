"""Accuracy of a model on a node split: by mini-batch inference over sampled neighbourhoods, or exactly (layer-wise)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from morphpipe.nn.hetero_layerwise import typed_layerwise_inference
from morphpipe.nn.layerwise import layerwise_inference
from morphpipe.ops.community import GraphBlock
from morphpipe.sampling.cpu_batcher import CpuBatcher

EVAL_MODES = ("sampled", "full")


@torch.no_grad()
def accuracy(model: nn.Module, graph, seeds: torch.Tensor, fanouts: Sequence[int], *, batch_size: int = 4096,
             device: torch.device | str = "cpu", num_threads: int | None = None, seed: int = 0,
             progress: bool = False) -> float:
    """Share of `seeds` whose predicted class is their label (eval mode, sampled fanouts, fixed seed); `progress`
    shows a bar over the batches."""
    if seeds.numel() == 0:
        raise ValueError("accuracy needs at least one seed; this split of the graph is empty")
    device = torch.device(device)
    dtype = next(model.parameters()).dtype
    was_training = model.training
    model.eval()
    correct = 0
    try:
        with CpuBatcher(graph, fanouts, batch_size, seeds=seeds, shuffle=False, seed=seed, num_threads=num_threads,
                        pin_memory=device.type == "cuda") as batcher:
            for batch in tqdm(batcher, total=len(batcher), desc="evaluating", unit="batch", leave=False,
                              disable=not progress):
                batch = batch.to(device, non_blocking=True)
                logits = model(batch.blocks, batch.x.to(dtype))
                correct += int((logits.argmax(dim=1) == batch.y).sum())
    finally:
        model.train(was_training)
    return correct / seeds.numel()


def full_accuracy(model: nn.Module, graph, seeds: torch.Tensor, *, device: torch.device | str = "cpu",
                  chunk_size: int | None = None, memory_budget: int | None = None,
                  graph_block: GraphBlock | None = None, progress: bool = True,
                  log: Callable[[str], None] | None = None) -> float:
    """Share of `seeds` whose exact full-neighbourhood prediction (layer-wise inference) is their label; on a
    heterogeneous graph by typed layer-wise inference (`graph_block` does not apply)."""
    return full_accuracies(model, graph, {"seeds": seeds}, device=device, chunk_size=chunk_size,
                           memory_budget=memory_budget, graph_block=graph_block, progress=progress, log=log)["seeds"]


def full_accuracies(model: nn.Module, graph, splits: dict[str, torch.Tensor], *, device: torch.device | str = "cpu",
                    chunk_size: int | None = None, memory_budget: int | None = None,
                    graph_block: GraphBlock | None = None, progress: bool = True,
                    log: Callable[[str], None] | None = None) -> dict[str, float]:
    """`full_accuracy` of several seed sets (e.g. every split) from one layer-wise pass: the layers below the last
    are computed once for them all (the last for their seeds together), not once per set."""
    for name, seeds in splits.items():
        if seeds.numel() == 0:
            raise ValueError(f"accuracy needs at least one seed; split {name!r} of the graph is empty")
    seeds = torch.cat([torch.as_tensor(seeds, dtype=torch.int64) for seeds in splits.values()])
    if getattr(graph, "is_hetero", False):
        logits = typed_layerwise_inference(model, graph, seeds, chunk_size=chunk_size, memory_budget=memory_budget,
                                           device=device, progress=progress, log=log)
    else:
        logits = layerwise_inference(model, graph, seeds, chunk_size=chunk_size, memory_budget=memory_budget,
                                     device=device, graph_block=graph_block, progress=progress, log=log)
    correct = logits.argmax(dim=1) == graph.labels[seeds]
    results, start = {}, 0
    for name, split in splits.items():
        results[name] = int(correct[start:start + split.numel()].sum()) / split.numel()
        start += split.numel()
    return results
