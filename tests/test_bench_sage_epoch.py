"""scripts/dgl_peer.py and scripts/bench_sage_epoch.py's recorded batches: what makes the DGL comparison fair.

The DGL peer's run passes its settings and threads and returns the last JSON line (or stops with DGL's stderr);
the SAGE epoch benchmark's task records the seeds of every step the Trainer trains, each epoch's once, which is
what DGL's side then trains in the same order.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from morphpipe.executor import Trainer
from morphpipe.profiler import Profile
from morphpipe.scheduler import plan_from_profile
from morphpipe.sampling.throughput import measurement_seeds

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the scripts import dgl_peer as their sibling
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_peer_run_passes_settings_and_threads_and_returns_the_last_json_line(monkeypatch):
    peer = load_script("dgl_peer", monkeypatch)
    script = ("import json, os, sys\nprint('noise')\n"
              "print(json.dumps({'got': json.loads(sys.argv[1]), 'omp': os.environ['OMP_NUM_THREADS']}))")
    assert peer.run_dgl_script(script, {"batches": 3}, threads=2, dgl_python=sys.executable) == \
        {"got": {"batches": 3}, "omp": "2"}
    with pytest.raises(SystemExit, match=r"DGL's run failed \(exit 1\):\n.*no dgl here"):
        peer.run_dgl_script("import sys; sys.exit('no dgl here')", {}, threads=1, dgl_python=sys.executable)


@pytest.mark.parametrize("shares_cores", [False, True])
def test_the_recorded_order_holds_every_trained_step_once_per_epoch(tiny, monkeypatch, shares_cores):
    bench = load_script("bench_sage_epoch", monkeypatch)
    batches, batch_size, epochs = 3, 64, 2
    units = measurement_seeds(tiny.train_idx, batches, batch_size, seed=0)
    task = bench.RecordedSubset(units)
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2))
    plan = dataclasses.replace(plan, shares_cores=shares_cores)
    torch.manual_seed(0)
    model = task.build_model("sage", tiny, num_layers=2, hidden=8, dropout=0.5)
    with Trainer(tiny, model, plan, fanouts=[4, 3], batch_size=batch_size, task=task, progress=False,
                 log=lambda _: None) as trainer:
        trainer.fit(epochs, validate=False)
    order = torch.cat(task.trained).reshape(epochs, -1)
    for epoch in order:
        assert torch.equal(epoch.sort().values, units.sort().values)
    assert not torch.equal(order[0], order[1])  # the batcher reshuffles each epoch: DGL gets each epoch's own order


class DglSageConv(torch.nn.Module):
    """dgl.nn.SAGEConv's parameters as the peer's helpers see them: fc_neigh without bias, fc_self with it."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.fc_neigh = torch.nn.Linear(in_features, out_features, bias=False)
        self.fc_self = torch.nn.Linear(in_features, out_features)


@pytest.mark.parametrize("eval_mode", ["sampled", "full"])
def test_a_dgl_model_saved_back_is_scored_on_the_neighbourhoods_ours_was(tiny, monkeypatch, tmp_path, eval_mode):
    bench = load_script("bench_sage_epoch", monkeypatch)
    peer_helpers = {"np": bench.np, "torch": torch}
    exec(bench.DGL_OUR_SAGE_WEIGHTS, peer_helpers)  # the DGL side's own text, run on stand-in layers
    args = bench.argparse.Namespace(fanouts=[4, 3, 2], eval_mode=eval_mode)
    torch.manual_seed(0)
    ours = bench.NodeClassification().build_model("sage", tiny, num_layers=3, hidden=bench.HIDDEN,
                                                  dropout=bench.DROPOUT)
    bench.np.savez(tmp_path / "ours.npz", **{name: t.detach().numpy() for name, t in ours.state_dict().items()})
    dims = [tiny.feature_dim, bench.HIDDEN, bench.HIDDEN, tiny.num_classes]
    convs = torch.nn.ModuleList(DglSageConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
    peer_helpers["copy_our_sage_weights"](convs, tmp_path / "ours.npz")
    peer_helpers["save_as_our_sage_weights"](convs, tmp_path / "back.npz")
    val = tiny.val_idx[:200]
    with bench.np.load(tmp_path / "back.npz") as back:
        assert bench.our_evaluation(tiny, args, 3, val, back) == bench.val_accuracy(ours, tiny, args, 3, val)


def test_the_accuracy_gap_pairs_each_seed_and_gives_its_standard_error(monkeypatch):
    bench = load_script("bench_sage_epoch", monkeypatch)
    args = bench.argparse.Namespace(val_nodes=1000)
    rows = [{"ours": {"float32": {"val_acc": ours}},
             "dgl": {"by_workers": {"0": {"val_acc_our_eval": a}, "1": {"val_acc_our_eval": b}}}}
            for ours, a, b in ((0.990, 0.985, 0.995), (0.993, 0.990, 0.990), (0.980, 0.981, 0.983))]
    # per seed, nodes: 0, +3, -2 -> mean +0.3, standard deviation 2.52, standard error 1.45
    assert bench.accuracy_gap("g", rows, args) == \
        "g: ours float32 - DGL, same evaluator, over 3 seeds: +0.3 +- 1.5 (standard error) of 1000 val nodes"
