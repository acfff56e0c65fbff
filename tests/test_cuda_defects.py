"""The host-side halves of the CUDA defect fixes, which run without a GPU.

Refusing copy-on-write file mappings where registrations cannot be read-only, the CUDA
architectures in the build cache key, the deterministic backward choice, the max backward
through torch's deterministic index_add_, and the topology check the CPU and GPU samplers share.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_ops_fused import make_block
from test_sampling import make_graph

from morphpipe import native, ops
from morphpipe.ops import choice, determinism
from morphpipe.sampling.pinning import PinningError, check_registrable, file_mapping


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for one test, restored afterwards."""
    before, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


# --- pinning: copy-on-write file mappings ---------------------------------------------------------------------


def copy_on_write_map(tmp_path) -> torch.Tensor:
    path = tmp_path / "features.npy"
    np.save(path, np.ones((256, 8), dtype=np.float32))
    return torch.from_numpy(np.load(path, mmap_mode="c"))


def test_copy_on_write_map_is_refused_without_read_only_registration(tmp_path):
    mapped = copy_on_write_map(tmp_path)
    mapping = file_mapping(mapped)
    assert mapping is not None and mapping.private and mapping.path.endswith("features.npy")
    with pytest.raises(PinningError, match=r"'features'.*copy-on-write.*pinning='copy'.*mmap=False"):
        check_registrable("features", mapped, read_only_supported=False)


def test_copy_on_write_map_is_accepted_with_read_only_registration(tmp_path):
    check_registrable("features", copy_on_write_map(tmp_path), read_only_supported=True)


def test_anonymous_and_shared_file_memory_is_accepted(tmp_path):
    check_registrable("features", torch.ones(4096), read_only_supported=False)
    path = tmp_path / "shared.bin"
    path.write_bytes(bytes(4096 * 4))
    shared = torch.from_file(str(path), shared=True, size=4096, dtype=torch.float32)
    mapping = file_mapping(shared)
    assert mapping is not None and not mapping.private
    check_registrable("features", shared, read_only_supported=False)


# --- native build cache key -----------------------------------------------------------------------------------


@pytest.fixture
def cuda_toolchain(monkeypatch):
    """build_config() as on a machine whose torch and nvcc can build the CUDA kernels."""
    monkeypatch.setattr(native, "_cuda_toolchain_problem", lambda: None)
    return monkeypatch


def test_build_directory_depends_on_the_cuda_arch_list(cuda_toolchain):
    cuda_toolchain.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    ampere = native.build_config()
    cuda_toolchain.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    both = native.build_config()
    assert ampere.with_cuda and ampere.cuda_arch_list == "8.0"
    assert both.cuda_arch_list == "8.0;9.0+PTX"
    assert ampere.build_dir != both.build_dir
    assert both.build_dir.name.endswith("cuda-sm-8-0-9-0-ptx")


def test_build_directory_follows_the_visible_devices_without_an_arch_list(cuda_toolchain):
    cuda_toolchain.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    cuda_toolchain.setattr(torch.cuda, "is_available", lambda: True)
    cuda_toolchain.setattr(torch.cuda, "device_count", lambda: 2)
    dirs = {}
    for name, capabilities in {"hopper": [(9, 0), (9, 0)], "mixed": [(8, 6), (9, 0)]}.items():
        cuda_toolchain.setattr(torch.cuda, "get_device_capability", lambda index, c=capabilities: c[index])
        dirs[name] = native.build_config()
    assert dirs["hopper"].cuda_arch_list == "9.0" and dirs["mixed"].cuda_arch_list == "8.6;9.0"
    assert dirs["hopper"].build_dir != dirs["mixed"].build_dir


def test_cpu_build_directory_has_no_arch_part(monkeypatch):
    monkeypatch.setattr(native, "_cuda_toolchain_problem", lambda: "no nvcc")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    config = native.build_config()
    assert config.cuda_arch_list is None and config.build_dir.name.endswith("-cpu")


# --- deterministic backward ---------------------------------------------------------------------------------------


def test_atomic_backward_options_are_dropped_under_deterministic_mode(deterministic):
    assert determinism.backward_options("aggregate.backward") == ("transpose",)
    assert determinism.backward_options("gat.backward") == ("transpose",)
    assert determinism.backward_options("aggregate.kernel") == choice.DECISIONS["aggregate.kernel"]


def test_every_backward_option_is_open_without_deterministic_mode():
    assert not torch.are_deterministic_algorithms_enabled()
    assert determinism.backward_options("aggregate.backward") == ("transpose", "scatter")


def test_forcing_scatter_under_deterministic_mode_is_an_error(deterministic):
    with ops.force_choices({"aggregate.backward": "scatter"}):
        with pytest.raises(RuntimeError, match="nondeterministic.*aggregate.backward=transpose"):
            determinism.backward_options("aggregate.backward")


def test_forcing_scatter_under_warn_only_mode_is_allowed():
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with ops.force_choices({"aggregate.backward": "scatter"}):
            assert "scatter" in determinism.backward_options("aggregate.backward")
    finally:
        torch.use_deterministic_algorithms(False)


def cheap_scatter(monkeypatch):
    """Make the cost model prefer the atomic scatter backward for every block."""
    from morphpipe.ops import fused

    monkeypatch.setattr(fused, "_backward_costs", lambda block, edges, width: {"transpose": 1.0, "scatter": 0.0})


def backward_variants_run(fn) -> dict[str, dict[str, int]]:
    choice.clear_choices()
    fn()
    return choice.choice_counts()


def sum_and_gat_backward(block, num_src):
    x = torch.randn(num_src, 8, requires_grad=True)
    with ops.use_backend("fused"):
        ops.aggregate(block, x, "sum").sum().backward()
        h = torch.randn(num_src, 2, 8, requires_grad=True)
        score_src, score_dst = torch.randn(num_src, 2), torch.randn(block.num_dst, 2)
        ops.gat_attention(block, h, score_src, score_dst, 0.2, True).sum().backward()


def test_the_fused_backward_takes_the_transpose_under_deterministic_mode(monkeypatch, deterministic):
    cheap_scatter(monkeypatch)
    block = make_block([[1, 2], [0, 3, 3], [4]], 5)
    counts = backward_variants_run(lambda: sum_and_gat_backward(block, 5))
    assert counts["aggregate.backward"] == {"transpose": 1}
    assert counts["gat.backward"] == {"transpose": 1}


def test_the_fused_backward_follows_the_cost_model_otherwise(monkeypatch):
    cheap_scatter(monkeypatch)
    block = make_block([[1, 2], [0, 3, 3], [4]], 5)
    counts = backward_variants_run(lambda: sum_and_gat_backward(block, 5))
    assert counts["aggregate.backward"] == {"scatter": 1}


def test_a_cached_scatter_choice_is_not_reused_under_deterministic_mode(monkeypatch):
    cheap_scatter(monkeypatch)
    block = make_block([[1, 2], [0, 3, 3], [4]], 5)
    choice.clear_choices()
    sum_and_gat_backward(block, 5)
    torch.use_deterministic_algorithms(True)
    try:
        sum_and_gat_backward(block, 5)
    finally:
        torch.use_deterministic_algorithms(False)
    assert choice.choice_counts()["aggregate.backward"] == {"scatter": 1, "transpose": 1}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weighted", [False, True])
def test_deterministic_max_backward_matches_the_native_kernel(dtype, weighted):
    block = make_block([[], [2, 2, 4], [], [0, 5], [4, 1], [6, 0, 3, 2]], 7)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, generator=generator).to(dtype)
    acc = torch.float32 if dtype == torch.bfloat16 else dtype
    weight = torch.rand(block.nnz, generator=generator).to(acc) if weighted else None
    _, argmax = native.ops().spmm_max(block.indptr, block.indices, x, weight)
    grad = torch.randn(block.num_dst, 5, generator=generator).to(dtype)
    expected = native.ops().spmm_max_backward(block.indices, argmax, grad, x, weight, True, True)
    got = determinism.max_backward(block.indices, argmax, grad, x, weight, True, True)
    assert got[0].dtype == dtype and got[1].dtype == acc
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])


def test_deterministic_max_backward_without_edges():
    block = make_block([[], []], 3)
    argmax = torch.full((2, 4), -1)
    grad_x, grad_weight = determinism.max_backward(block.indices, argmax, torch.ones(2, 4), torch.ones(3, 4), None,
                                                   True, True)
    assert torch.equal(grad_x, torch.zeros(3, 4)) and grad_weight.numel() == 0


def test_max_aggregation_gradient_is_the_same_under_deterministic_mode(deterministic):
    block = make_block([[1, 2], [0, 3, 3], [4], []], 5)
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    with ops.use_backend("fused"):
        ops.aggregate(block, x, "max").sum().backward()
    fused_grad = x.grad.clone()
    x.grad = None
    with ops.use_backend("reference"):
        ops.aggregate(block, x, "max").sum().backward()
    torch.testing.assert_close(fused_grad, x.grad)


# --- the topology check both samplers share -----------------------------------------------------------------------


def test_sampler_refuses_indptr_that_does_not_end_at_the_edge_count():
    graph = make_graph(50)
    short = graph.indices[:-3].clone()
    with pytest.raises(RuntimeError, match=r"indptr\[-1\] = \d+ but indices has \d+ entries"):
        native.ops().sample_neighbors(graph.indptr, short, torch.arange(4), [3, 2], 0)
