"""Distributed pieces without processes: the seed split, launcher environments, core shares, cluster prediction,
and heterogeneous virtual ranks against the simulator."""
from __future__ import annotations

import argparse

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from morphpipe.commands.cli import main
from morphpipe.distributed import SeedSplit, check_exactly_once, detect, local_profile, predict_cluster
from morphpipe.distributed.affinity import rank_cores
from morphpipe.commands.train_distributed import without_nproc
from morphpipe.commands.simulate import parse_node
from morphpipe.distributed.split import apportion
from morphpipe.distributed.virtual import run_virtual_cluster
from morphpipe.profiler import Profile
from morphpipe.sampling.epochs import epoch_order


@settings(max_examples=40, deadline=None)
@given(num_seeds=st.integers(8, 1500), batch=st.integers(4, 300), mode=st.sampled_from(["even", "weighted"]),
       weights=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4), epoch=st.integers(0, 3))
def test_every_seed_once_per_epoch_and_step_k_is_the_single_process_batch(num_seeds, batch, mode, weights,
                                                                          epoch) -> None:
    seeds = torch.arange(100, 100 + num_seeds)
    try:
        split = SeedSplit.make(num_seeds, batch, weights, mode)
    except ValueError as error:
        assert "last step" in str(error) or "global batch" in str(error)
        return
    world = len(weights)
    parts = [split.rank_seeds(seeds, 7, epoch, rank) for rank in range(world)]
    assert torch.equal(torch.cat(parts).sort().values, seeds), "every seed exactly once over all ranks"
    sizes = [split.rank_sizes(rank) for rank in range(world)]
    assert all(len(s) == split.steps for s in sizes) and all(min(s) >= 1 for s in sizes)
    order = epoch_order(seeds, 7, epoch)
    offsets = [0] * world
    for k in range(split.steps):
        union = []
        for rank in range(world):
            union.append(parts[rank][offsets[rank]:offsets[rank] + sizes[rank][k]])
            offsets[rank] += sizes[rank][k]
        assert torch.equal(torch.cat(union), order[k * batch:(k + 1) * batch])
        assert split.step_total(k) == sum(s[k] for s in sizes)
    if mode == "weighted":
        ideal = [batch * w / sum(weights) for w in weights]
        # Ranks raised to the 1-seed minimum take their shortfall from the others: that much more slack.
        raised = sum(1.0 - q for q in ideal if q < 1.0)
        assert all(abs(b - q) < 1.0 + raised + 1e-9 or b == 1 for b, q in zip(split.local_batches, ideal))
    else:
        assert max(split.local_batches) - min(split.local_batches) <= 1


def test_split_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="--batch-size"):
        SeedSplit.make(100, 2, [1.0, 1.0, 1.0], "even")
    with pytest.raises(ValueError, match="last step"):
        SeedSplit.make(101, 50, [1.0, 1.0], "even")  # 1 seed left for 2 ranks
    with pytest.raises(ValueError, match="split must be one of"):
        SeedSplit.make(100, 10, [1.0], "random")
    with pytest.raises(ValueError, match="weights must be"):
        apportion(10, [1.0, 0.0])


def test_apportion_gives_the_leftover_seeds_to_the_largest_remainders() -> None:
    # By hand: 10 seeds by weights 1:2:4 are quotas 1.43, 2.86, 5.71; floors 1, 2, 5 leave two seeds, which go to
    # the largest remainders (.86, then .71), not the smallest.
    assert apportion(10, [1.0, 2.0, 4.0]) == [1, 3, 6]
    # 11 by 3:3:5: quotas 3.0, 3.0, 5.0 exactly; 9 by 1:1:1:1:5: quotas 1, 1, 1, 1, 5.
    assert apportion(11, [3.0, 3.0, 5.0]) == [3, 3, 5]
    assert apportion(9, [1.0, 1.0, 1.0, 1.0, 5.0]) == [1, 1, 1, 1, 5]
    # 8 by 1:1:1: quotas 2.67 each: the two extra seeds go to the lowest ranks on a tie.
    assert apportion(8, [1.0, 1.0, 1.0]) == [3, 3, 2]


def test_exactly_once_check_names_the_seeds() -> None:
    check_exactly_once(torch.ones(5, dtype=torch.int32), 0)
    with pytest.raises(RuntimeError, match=r"epoch 2: 2 training seeds .*seed #1 x2, seed #3 x0"):
        check_exactly_once(torch.tensor([1, 2, 1, 0], dtype=torch.int32), 1)


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500"}


def test_launcher_environments() -> None:
    assert detect({}) is None
    env = detect(TORCHRUN)
    assert (env.rank, env.world_size, env.local_rank, env.launcher, env.init_method) == (
        1, 2, 1, "torchrun", "tcp://10.0.0.1:29500")
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "1234"}
    env = detect(ompi)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.launcher) == (3, 4, 1, 2, "mpirun")


def test_launcher_defaults_and_addresses() -> None:
    """Without LOCAL_RANK / LOCAL_WORLD_SIZE every rank is on one node: its local rank is its rank; an IPv6
    address is bracketed in the rendezvous URL."""
    one_node = {key: value for key, value in TORCHRUN.items() if not key.startswith("LOCAL_")}
    env = detect(one_node)
    assert (env.rank, env.local_rank, env.local_world_size) == (1, 1, 2)
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "MASTER_ADDR": "node0", "MASTER_PORT": "1234"}
    env = detect(ompi)
    assert (env.rank, env.local_rank, env.local_world_size) == (2, 2, 3)
    assert detect({**TORCHRUN, "MASTER_ADDR": "fe80::1"}).init_method == "tcp://[fe80::1]:29500"
    assert detect({**TORCHRUN, "MASTER_ADDR": "::1"}).init_method == "tcp://[::1]:29500"


@pytest.mark.parametrize("change, message", [
    ({"MASTER_PORT": "0"}, "MASTER_PORT='0' must be a TCP port in 1..65535"),
    ({"RANK": "2"}, r"RANK=2 must lie in \[0, WORLD_SIZE=2\)"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ({"MASTER_PORT": None}, "MASTER_PORT is not set while MASTER_ADDR is"),
    ({"MASTER_ADDR": None, "MASTER_PORT": None}, "MASTER_ADDR and MASTER_PORT are not"),
    ({"WORLD_SIZE": None}, "WORLD_SIZE is not set"),
    ({"LOCAL_RANK": "5"}, "LOCAL_RANK=5 must lie in"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' must be a TCP port"),
])
def test_inconsistent_launcher_environments_are_named(change, message) -> None:
    environ = {**TORCHRUN, **change}
    environ = {key: value for key, value in environ.items() if value is not None}
    with pytest.raises(ValueError, match=message):
        detect(environ)


def test_ranks_on_a_node_split_its_cores_and_keep_a_launcher_binding() -> None:
    same = [("a", [0, 1, 2, 3, 4])] * 2 + [("b", [0, 1])]
    assert [rank_cores(same, r) for r in range(3)] == [[0, 1], [2, 3, 4], [0, 1]]
    bound = [("a", [0]), ("a", [1])]
    assert [rank_cores(bound, r) for r in range(2)] == [[0], [1]]
    crowded = [("a", [0, 1])] * 3
    assert [rank_cores(crowded, r) for r in range(3)] == [[0], [1], [0]]


def test_nproc_is_removed_from_the_rank_command_line() -> None:
    assert without_nproc(["train", "--nproc", "2", "--epochs", "1", "--nproc=3"]) == ["train", "--epochs", "1"]


def synthetic(factor: float, batches: int = 12, cores: int = 2) -> Profile:
    """A GPU machine whose every phase takes `factor` times as long as the base one."""
    return Profile.synthetic(t_cb=0.24 * factor, t_m=0.08 * factor, t_gb=0.096 * factor, t_dma=0.032 * factor,
                             num_batches=batches, cores=cores, workload={"batch_size": 64})


def test_local_profile_scales_phases_by_seeds_per_batch() -> None:
    profile = synthetic(1.0)
    half = local_profile(profile, 32, 30)
    assert half.num_batches == 30 and half.workload["batch_size"] == 32
    assert half.cpu_batch_time() == pytest.approx(profile.cpu_batch_time() / 2)
    assert half.training.mean_s == pytest.approx(profile.training.mean_s / 2)


def test_heterogeneous_virtual_ranks_match_the_prediction_and_weighted_beats_even() -> None:
    """Rank 1's phases take twice as long; the real Executor runs both on virtual devices, steps synchronised."""
    profiles = [synthetic(1.0), synthetic(2.0)]
    measured, predicted = {}, {}
    for mode in ("even", "weighted"):
        prediction = predict_cluster(profiles, 12 * 64, 64, mode)
        best = None
        for _ in range(2):
            epoch = run_virtual_cluster(profiles, prediction)
            if best is None or abs(epoch.epoch_s / epoch.predicted_epoch_s - 1) < abs(best / prediction.epoch_s - 1):
                best = epoch.epoch_s
            if abs(best / prediction.epoch_s - 1) <= 0.05:
                break
        measured[mode], predicted[mode] = best, prediction.epoch_s
        assert measured[mode] == pytest.approx(predicted[mode], rel=0.10), mode
    assert predicted["even"] / predicted["weighted"] > 1.3
    assert measured["even"] / measured["weighted"] == pytest.approx(predicted["even"] / predicted["weighted"], rel=0.10)


def test_simulate_a_cluster_with_even_and_weighted_splits(tmp_path, capsys) -> None:
    profile = tmp_path / "cpu.json"
    Profile.synthetic(t_cb=0.02, t_m=0.03, num_batches=40, cores=8, cpu_efficiency=0.9, training_efficiency=0.8,
                      workload={"batch_size": 512}).save(profile)
    assert main(["simulate", "--node", f"{profile}:2", "--node", f"{profile}:2:4"]) == 0
    out = capsys.readouterr().out
    assert "cpu.json @4 cores" in out and "cluster epoch (4 ranks, 40 steps of 512 seeds)" in out
    even, weighted = (float(out.split(f"{name} ")[-1].split(" s")[0]) for name in ("even", "weighted"))
    assert weighted < even
    assert parse_node("a.json") == parse_node("a.json:1")
    with pytest.raises(argparse.ArgumentTypeError, match="PROFILE"):
        parse_node("a.json:0")
