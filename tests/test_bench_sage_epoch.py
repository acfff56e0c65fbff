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
