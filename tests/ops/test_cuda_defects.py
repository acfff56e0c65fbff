"""The host-side halves of the CUDA defect fixes, which run without a GPU.

Refusing copy-on-write file mappings where registrations cannot be read-only, the CUDA
architectures in the build cache key, the deterministic backward choice, the max backward
through torch's deterministic index_add_, and the topology check the CPU and GPU samplers share.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from morphpipe import native, ops
from morphpipe.ops import choice, determinism
from morphpipe.sampling.pinning import PinningError, check_registrable, file_mapping
from tests.conftest import make_graph
from tests.ops.conftest import make_block


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


class RecordingCudaHost:
    """Stands in for the native module's cudaHostRegister / cudaHostUnregister and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def cuda_host_register(self, tensor: torch.Tensor, read_only: bool) -> str:
        self.calls.append(("register", tensor.data_ptr()))
        return ""

    def cuda_host_unregister(self, tensor: torch.Tensor) -> str:
        self.calls.append(("unregister", tensor.data_ptr()))
        return ""


def test_a_shared_registration_is_undone_by_its_last_user_only():
    """Two batchers over one graph register its features once; the first to close must not unpin them."""
    from morphpipe.sampling.pinning import _Registrations

    host, registrations, features = RecordingCudaHost(), _Registrations(), torch.ones(64, 4)
    address = features.data_ptr()
    assert registrations.acquire(host, features, True) == "" and registrations.acquire(host, features, True) == ""
    assert host.calls == [("register", address)]
    assert registrations.release(host, features) == ""
    assert host.calls == [("register", address)] and registrations.holds(features), "the other user still reads it"
    assert registrations.release(host, features) == ""
    assert host.calls == [("register", address), ("unregister", address)] and not registrations.holds(features)


# --- native build cache key -----------------------------------------------------------------------------------


@pytest.fixture
def from_sources(monkeypatch, tmp_path):
    """build_config() choosing the just-in-time build, also where a prebuilt module sits in the package."""
    monkeypatch.setattr(native, "PREBUILT_INFO", tmp_path / "no_prebuilt_module.json")
    return monkeypatch


@pytest.fixture
def cuda_toolchain(from_sources):
    """build_config() as on a machine whose torch and nvcc can build the CUDA kernels."""
    from_sources.setattr(native, "_cuda_toolchain_problem", lambda: None)
    return from_sources


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


def test_cpu_build_directory_has_no_arch_part(from_sources):
    from_sources.setattr(native, "_cuda_toolchain_problem", lambda: "no nvcc")
    from_sources.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
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
    # the row-wise kernel, whose backward is the choice under test (a block this small may go dense)
    with ops.use_backend("fused"), ops.force_choices({"aggregate.kernel": "rowwise"}):
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


# --- on a CUDA device: the kernels themselves ---------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cuda_kernels():
    """The ops, or a skip when this machine's CUDA kernels were not built."""
    from morphpipe.ops import fused

    problem = fused.unavailable("cuda")
    if problem is not None:
        pytest.skip(f"the CUDA kernels were not built: {problem}")
    return native.ops()


@cuda
@pytest.mark.parametrize("bad", ["index", "indptr", "row_order"])
def test_a_bad_structure_raises_and_leaves_the_cuda_context_usable(bad):
    kernels = cuda_kernels()
    indptr = torch.tensor([0, 2, 4], device="cuda")
    indices = torch.tensor([1, 2, 0, 9 if bad == "index" else 3], device="cuda")
    if bad == "indptr":
        indptr = torch.tensor([0, 3, 2], device="cuda")
    order = torch.tensor([1, 5], device="cuda") if bad == "row_order" else None
    x = torch.randn(5, 8, device="cuda")
    message = {"index": r"indices\[3\] = 9 is outside", "indptr": "nondecreasing", "row_order": "permutation"}[bad]
    for call in (lambda: kernels.spmm_sum(indptr, indices, x, None, None, None, False, order),
                 lambda: kernels.spmm_max(indptr, indices, x, None, order)):
        with pytest.raises(RuntimeError, match=message):
            call()
    torch.cuda.synchronize()
    assert torch.ones(3, device="cuda").sum().item() == 3  # no sticky device-side assert


@cuda
def test_cuda_max_treats_nans_as_the_cpu_kernel_does():
    kernels = cuda_kernels()
    nan = float("nan")
    x = torch.tensor([[nan, 1.0], [2.0, nan], [nan, nan], [-float("inf"), 3.0]])
    indptr, indices = torch.tensor([0, 2, 3, 5, 5]), torch.tensor([0, 1, 2, 2, 3])
    expected = kernels.spmm_max(indptr, indices, x, None)
    got = kernels.spmm_max(indptr.cuda(), indices.cuda(), x.cuda(), None)
    torch.testing.assert_close(got[0].cpu(), expected[0], equal_nan=True)
    assert torch.equal(got[1].cpu(), expected[1])


def hub_graph(degree: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Node 0 points to nodes 1..degree, which have no neighbours (pinned host CSC)."""
    indptr = torch.full((degree + 2,), degree, dtype=torch.int64)
    indptr[0] = 0
    return indptr.pin_memory(), torch.arange(1, degree + 1, dtype=torch.int32).pin_memory()


@cuda
@pytest.mark.parametrize("fanout", [100, -1])
def test_a_hub_is_sampled_by_blocks_with_a_correct_sample(fanout):
    from scipy import stats

    kernels = cuda_kernels()
    degree = 10_000  # above the one-warp limit (kWarpMaxDegree)
    indptr, indices = hub_graph(degree)
    seeds = torch.tensor([0], device="cuda")
    counts = torch.zeros(degree + 1, dtype=torch.int64)
    for seed in range(200 if fanout > 0 else 1):
        input_nodes, block_indptrs, block_indices = kernels.sample_neighbors_cached(
            indptr, indices, seeds, [fanout], seed, torch.empty(0, dtype=torch.int32, device="cuda"),
            torch.empty(0, dtype=torch.int64, device="cuda"), torch.empty(0, dtype=torch.int32, device="cuda"))
        sampled = input_nodes.cpu()[block_indices[0].cpu()]
        expected_count = degree if fanout < 0 else fanout
        assert sampled.numel() == expected_count and torch.unique(sampled).numel() == expected_count
        assert int(sampled.min()) >= 1 and int(sampled.max()) <= degree
        assert input_nodes.untyped_storage().nbytes() == input_nodes.numel() * 8  # not a view of a larger buffer
        counts[sampled] += 1
    if fanout > 0:
        repeat = kernels.sample_neighbors_cached(
            indptr, indices, seeds, [fanout], 199, torch.empty(0, dtype=torch.int32, device="cuda"),
            torch.empty(0, dtype=torch.int64, device="cuda"), torch.empty(0, dtype=torch.int32, device="cuda"))
        assert torch.equal(repeat[0].cpu()[repeat[2][0].cpu()], sampled)
        # every neighbour equally likely: 200 * 100 draws over 10^4 neighbours
        assert stats.chisquare(counts[1:].numpy()).pvalue > 1e-4


@cuda
def test_gather_rows_reads_odd_half_rows_and_row_strided_sources():
    kernels = cuda_kernels()
    index = torch.randint(0, 100, (64,), device="cuda")
    half = torch.randn(100, 7).half()  # 14-byte rows: 2-byte vectors
    assert torch.equal(kernels.gather_rows(half.pin_memory(), index).cpu(), half[index.cpu()])
    host_slice = torch.randn(100, 16).pin_memory()[:, 3:10]  # unit stride along rows, pitch 16
    assert torch.equal(kernels.gather_rows(host_slice, index).cpu(), host_slice[index.cpu()])
    transposed = torch.randn(16, 100, device="cuda").t()  # the CPU op copes, so does the CUDA one
    assert torch.equal(kernels.gather_rows(transposed, index), transposed[index])
    with pytest.raises(RuntimeError, match="unit stride"):
        kernels.gather_rows(torch.randn(16, 100).pin_memory().t(), index)
    with pytest.raises(RuntimeError, match=r"index\[0\] = 100 is outside"):
        kernels.gather_rows(half.pin_memory(), torch.tensor([100], device="cuda"))


@cuda
def test_cuda_gradients_repeat_bit_for_bit_under_deterministic_mode(deterministic):
    cuda_kernels()
    from morphpipe.sampling.minibatch import Block

    generator = torch.Generator().manual_seed(0)
    num_src, num_dst = 2000, 500
    indices = torch.randint(0, num_src, (num_dst * 30,), generator=generator)
    block = Block(torch.arange(0, num_dst * 30 + 1, 30).cuda(), indices.cuda(), num_src, num_dst)
    x = torch.randn(num_src, 64, generator=generator).cuda()
    grads = []
    for _ in range(2):
        leaf = x.clone().requires_grad_(True)
        with ops.use_backend("fused"):
            (ops.aggregate(block, leaf, "sum").square().sum() + ops.aggregate(block, leaf, "max").sum()).backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])
