"""A typed graph with its features on disk gives the trainer's epoch its feature store counters, summed over the
node types, as a homogeneous graph's store does: what re-planning corrects the disk profile with."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from morphpipe.data.hetero_generator import MagSpec
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.executor import Trainer
from morphpipe.nn import NodeClassification
from morphpipe.profiler import Profile
from morphpipe.sampling import batches_per_epoch
from morphpipe.scheduler import plan_from_profile
from tests.conftest import saved_mag_with_float16_authors


class RecordingReplanner:
    """Keeps every epoch result the trainer hands to re-planning with each store's own counters at that moment, and
    never switches plans."""

    def __init__(self, stores) -> None:
        self.stores = stores
        self.seen = []

    def observe(self, result, plan):
        self.seen.append((result, {name: store.counters() for name, store in self.stores.items()}))
        return SimpleNamespace(switched=False, reason=None)


def test_each_epoch_counts_the_reads_of_every_featured_type(tmp_path):
    spec = MagSpec(num_papers=300, num_authors=200, num_institutions=10, num_fields=20, feature_dim=8)
    graph_dir = saved_mag_with_float16_authors(tmp_path / "mag", spec, author_width=4, seed=2)
    graph = HeteroGraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=1200, io_threads=2)
    task = NodeClassification()
    torch.manual_seed(0)
    model = task.build_model("rgcn", graph, num_layers=2, hidden=8)
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, cores=2,
                                               num_batches=batches_per_epoch(len(graph.train_idx), 64)))
    replanner = RecordingReplanner(dict(graph.feature_stores))
    with Trainer(graph, model, plan, fanouts=[4, 3], batch_size=64, progress=False, log=lambda line: None,
                 task=task, replanner=replanner) as trainer:
        trainer.fit(2, validate=False)
    [(result, by_type)] = replanner.seen  # the first epoch's (the last one is not re-planned after)
    reads = result.feature_reads
    assert reads is not None, "a typed graph's epoch must carry its feature store counters"
    assert all(store.num_cached > 0 for store in replanner.stores.values())  # both types cache some rows
    assert all(part.hits > 0 and part.misses > 0 for part in by_type.values())  # and read others
    for field in ("hits", "misses", "reads", "bytes_read", "read_gathers"):
        assert getattr(reads, field) == sum(getattr(part, field) for part in by_type.values()), field
