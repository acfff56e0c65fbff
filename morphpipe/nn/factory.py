"""Build a model by name, as the CLI and the executor do."""
from __future__ import annotations

from torch import nn

from morphpipe.nn.gat import GAT
from morphpipe.nn.gcn import GCN
from morphpipe.nn.mlp import MLP
from morphpipe.nn.sage import GraphSAGE

MODELS: dict[str, type[nn.Module]] = {"sage": GraphSAGE, "gcn": GCN, "gat": GAT, "mlp": MLP}


def build_model(
    name: str,
    in_dim: int,
    num_classes: int,
    num_layers: int = 3,
    hidden: int | None = None,
    heads: int | None = None,
    dropout: float = 0.5,
) -> nn.Module:
    """Model `name` ("sage" | "gcn" | "gat" | "mlp") with `forward(blocks, x) -> logits`.

    `hidden=None` takes the paper's width: GraphSAGE 256, GCN 16, GAT 64 per head, MLP 256.
    `heads` is GAT's head count (default 4) and is rejected for the other models.
    """
    if name not in MODELS:
        raise ValueError(f"name={name!r} is not a model; use one of {list(MODELS)}")
    kwargs: dict[str, object] = {"num_layers": num_layers, "dropout": dropout}
    if hidden is not None:
        kwargs["hidden"] = hidden
    if heads is not None:
        if name != "gat":
            raise ValueError(f"heads={heads!r} only applies to name='gat', not name={name!r}; drop heads")
        kwargs["heads"] = heads
    return MODELS[name](in_dim, num_classes, **kwargs)
