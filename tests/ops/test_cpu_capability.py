"""The CPU kernels at every instruction-set level this machine supports agree with the baseline build of them.

Each level (csrc/cpu/for_each_capability.h) is forced in turn in this process and runs every CPU kernel
on the same inputs: blocks with empty, duplicate-edge and heavy rows (past the prefetch distance), the
widths 1..768 across vector lanes and the 256-wide feature tiles, every dtype. Integer results (max
argmax, the dropout mask) and maxima are bit-equal; float sums within the tolerance below. The level
actually run is read back from the extension's dispatch record, so a forced avx2 never runs AVX-512 code.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from morphpipe import native

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
WIDTHS = [1, 3, 15, 16, 17, 255, 256, 257, 768]
LEVEL_BIT = {"baseline": 1, "avx2": 2, "avx512": 4}
# Largest max|level - baseline| / (1 + max|baseline|) per output: the levels contract a * b + c into FMAs and
# sum vector lanes in another order, so float sums differ in the last bits of the accumulation type; half types
# store a rounded float, where that difference can flip one rounding. Measured on these cases (Xeon with
# AVX-512, avx2 and avx512 against baseline, 2026-11-25): float32 4.6e-7, float64 1.1e-15, float16 1.1e-4,
# bfloat16 7.6e-4. Bounds: about 4x that for float32/float64, one ulp of the stored type for the half types.
TOLERANCE = {torch.float32: 2e-6, torch.float64: 5e-15, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def block(seed: int, rows: int = 40, num_src: int = 90) -> tuple[torch.Tensor, torch.Tensor]:
    """CSC with empty rows, a duplicate edge and a 40-edge row (past the 16-edge prefetch distance)."""
    generator = torch.Generator().manual_seed(seed)
    degrees = torch.randint(0, 6, (rows,), generator=generator)
    degrees[::7] = 0
    degrees[3] = 40
    indices = torch.randint(0, num_src, (int(degrees.sum()),), generator=generator)
    indices[1] = indices[0]
    indptr = torch.zeros(rows + 1, dtype=torch.int64)
    indptr[1:] = degrees.cumsum(0)
    return indptr, indices


def run_every_kernel(width: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every CPU kernel's outputs on inputs fixed by (width, dtype)."""
    ops = native.ops()
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    generator = torch.Generator().manual_seed(width)
    indptr, indices = block(width)
    rows, num_src, nnz = indptr.numel() - 1, 90, indices.numel()

    def rand(*shape: int, kind: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(kind)

    x, grad = rand(num_src, width), rand(rows, width)
    weight, src_scale, dst_scale = rand(nnz, kind=acc), rand(num_src, kind=acc), rand(rows, kind=acc)
    order = torch.randperm(rows, generator=generator)
    out = {"sum": ops.spmm_sum(indptr, indices, x, weight, src_scale, dst_scale, True, order),
           "sum_plain": ops.spmm_sum(indptr, indices, x, None, None, None, False, None),
           "scatter": ops.spmm_sum_scatter(indptr, indices, grad, weight, src_scale, dst_scale, True, num_src)}
    if dtype in (torch.float32, torch.float64):  # the one-pass projection takes these alone
        for name, row_order, keep in (("sum_project", order, True), ("sum_project_natural", None, True),
                                      ("sum_project_unkept", order, False)):
            out[name], out[name + "_out"] = ops.spmm_sum_project(indptr, indices, x, weight, src_scale, dst_scale,
                                                                  True, rand(width // 2 + 17, width), row_order, keep)
    out["max"], out["argmax"] = ops.spmm_max(indptr, indices, x, weight, order)
    out["max_grad_x"], out["max_grad_w"] = ops.spmm_max_backward(indices, out["argmax"], grad, x, weight, True, True)
    out["sddmm"] = ops.sddmm(indptr, indices, rand(rows, width), x)
    heads = 2
    for shared in (False, True):
        h = rand(num_src, 1 if shared else heads, width)
        score_src, score_dst = rand(num_src, heads, kind=acc), rand(rows, heads, kind=acc)
        g = rand(rows, heads, width)
        key = "gat_shared" if shared else "gat"
        result, row_max, row_sum = ops.gat_forward(indptr, indices, h, score_src, score_dst, 0.15, True, order)
        alpha, alpha_self, grad_edge, grad_self, grad_dst = ops.gat_backward(
            indptr, indices, h, score_src, score_dst, row_max, row_sum, g, 0.15, True, order)
        t_indptr, t_dst, t_eid = ops.csr_transpose(indptr, indices, num_src)
        out.update({f"{key}_out": result, f"{key}_max": row_max, f"{key}_sum": row_sum, f"{key}_alpha": alpha,
                    f"{key}_alpha_self": alpha_self, f"{key}_grad_edge": grad_edge, f"{key}_grad_self": grad_self,
                    f"{key}_grad_dst": grad_dst,
                    f"{key}_grad_h": ops.gat_grad_h(t_indptr, t_dst, t_eid, alpha, alpha_self, g, h.shape[1]),
                    f"{key}_grad_h_scatter": ops.gat_grad_h_scatter(indptr, indices, alpha, alpha_self, g, num_src,
                                                                    h.shape[1])})
    # Enough elements (> 32768) for the threaded path of the fused bias + activation + dropout.
    activations = rand(max(2, 40000 // width), width)
    bias = rand(width)
    for activation in ("relu", "identity"):
        for p in (0.0, 0.3):
            key = f"bad_{activation}_{p}"
            out[key], out[key + "_mask"] = ops.bias_act_dropout(activations, bias, activation, p, 7)
            out[key + "_grad"], out[key + "_bias_grad"] = ops.bias_act_dropout_backward(
                activations, out[key], out[key + "_mask"], activation, p, True)
    # The backward of ReLU + dropout and a mean with the first 25 sources' own rows (the transposed structure).
    t_indptr, t_dst, _ = ops.csr_transpose(indptr, indices, num_src)
    out["relu_mean_grad"], out["relu_mean_bias_grad"] = ops.relu_mean_backward(
        t_indptr, t_dst, grad, dst_scale, rand(25, width), rand(num_src, width).relu(), 0.3)
    # The pair scorer over pairs of rows of one table (the block's sources paired with random rows).
    table, pair_dst = rand(num_src, width), torch.randint(0, num_src, (nnz,), generator=generator)
    out["pair_dot"] = ops.pair_dot(table, indices, pair_dst)
    out["pair_dot_grad"] = ops.pair_dot_backward(table, indices, pair_dst, rand(nnz))
    # The row gather: 600 rows, past its prefetch distances and across its threads' 256-row chunks.
    out["gather_rows"] = ops.gather_rows(x, torch.randint(0, num_src, (600,), generator=generator))
    return out


def exact(name: str) -> bool:
    """Outputs every level must reproduce bit for bit: integers, maxima (one multiply each, no sums), copied rows."""
    return name in ("argmax", "max", "gather_rows") or name.endswith("_mask")


@pytest.fixture(scope="module")
def levels() -> list[str]:
    return native.supported_cpu_capabilities()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_level_agrees_with_the_baseline(levels, dtype):
    native.load().take_dispatched_capabilities()
    for width in WIDTHS:
        with native.forced_cpu_capability("baseline"):
            expected = run_every_kernel(width, dtype)
        assert native.load().take_dispatched_capabilities() == LEVEL_BIT["baseline"]
        for level in levels[1:]:
            with native.forced_cpu_capability(level):
                got = run_every_kernel(width, dtype)
            assert native.load().take_dispatched_capabilities() == LEVEL_BIT[level], f"{level} ran other code"
            for name, want in expected.items():
                have = got[name]
                assert have.dtype == want.dtype and have.shape == want.shape, name
                if exact(name):
                    assert torch.equal(have, want), f"{level} {name} width {width}: not bit-equal to baseline"
                    continue
                error = ((have.double() - want.double()).abs().max() / (1 + want.double().abs().max())).item() \
                    if want.numel() else 0.0
                assert error <= TOLERANCE[dtype], f"{level} {name} width {width}: {error:.3g} from baseline"


def test_the_best_supported_level_runs_by_default(levels):
    assert native.load().cpu_capability() == levels[-1]
    assert native.choose_cpu_capability(None, native.load().cpu_capabilities()) == levels[-1]


# A CPU with AVX2 but without AVX-512, as the extension would report it.
NO_AVX512 = [("baseline", True, True), ("avx2", True, True), ("avx512", True, False)]


def test_a_cpu_without_avx512_gets_avx2_and_refuses_avx512():
    assert native.choose_cpu_capability(None, NO_AVX512) == "avx2"
    assert native.choose_cpu_capability("baseline", NO_AVX512) == "baseline"
    with pytest.raises(ValueError, match="'avx512' cannot run here .this CPU lacks its instructions.; choose one of "
                                         "baseline, avx2"):
        native.choose_cpu_capability("avx512", NO_AVX512)
    with pytest.raises(ValueError, match="'sse9' is not a CPU capability; choose one of baseline, avx2, avx512"):
        native.choose_cpu_capability("sse9", NO_AVX512)


def test_the_extension_refuses_unknown_levels_and_keeps_its_level():
    module = native.load()
    before = module.cpu_capability()
    with pytest.raises(ValueError, match="'avx1024' is not a CPU capability"):
        module.set_cpu_capability("avx1024")
    assert module.cpu_capability() == before


def run_forced(level: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, native.CPU_CAPABILITY_ENV: level}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def test_forcing_avx2_runs_no_avx512_kernel_in_a_training_step():
    """A process started with MORPHPIPE_CPU_CAPABILITY=avx2 (a CPU without AVX-512, simulated) trains a GAT and a
    SAGE step with only avx2 kernels, and `morphpipe info` says so."""
    if "avx2" not in native.supported_cpu_capabilities():
        pytest.skip("this CPU has no AVX2")
    code = ("import torch; from morphpipe import native; from morphpipe.data import load_dataset; "
            "from morphpipe.nn import build_model; from morphpipe.nn.train_step import TrainStep, make_optimizer; "
            "from morphpipe.sampling import CpuBatcher; graph = load_dataset('tiny', progress=False); "
            "batch = next(iter(CpuBatcher(graph, [3, 3, 3], 64, num_threads=1, seed=0))); "
            "native.load().take_dispatched_capabilities(); "
            "[TrainStep(m, make_optimizer(m.parameters(), 1e-3, 'cpu'))(batch) "
            " for m in (build_model(n, graph.feature_dim, graph.num_classes) for n in ('sage', 'gat'))]; "
            "print(native.load().cpu_capability(), native.load().take_dispatched_capabilities())")
    result = run_forced("avx2", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["avx2", str(LEVEL_BIT["avx2"])]
    info = run_forced("avx2", "-m", "morphpipe", "info")
    assert "avx2 (forced by MORPHPIPE_CPU_CAPABILITY" in info.stdout


def test_an_unknown_forced_level_is_one_clear_cli_error():
    result = run_forced("avx9000", "-m", "morphpipe", "info")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "morphpipe info: error: MORPHPIPE_CPU_CAPABILITY='avx9000' is not a CPU capability; choose one of baseline, "
        "avx2, avx512")


def test_wider_instructions_appear_only_in_their_levels_kernels():
    """The built extension, disassembled: every function with a VEX- or EVEX-encoded instruction (AVX and up)
    belongs to the avx2 or avx512 kernel copies, and the avx2 copies use no AVX-512 register or mask, so the
    baseline code a CPU without them runs never holds one (for_each_capability.h keeps the copies apart)."""
    import re
    import shutil

    if not all(built for _, built, _ in native.load().cpu_capabilities()):
        pytest.skip("this build holds only the baseline kernels (not GCC on x86-64)")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    library = native.load().__file__
    listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", library], capture_output=True, text=True,
                             check=True).stdout
    function, wide = None, {}
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            continue
        fields = line.split("\t")
        if function is None or len(fields) < 2 or not fields[1].strip():
            continue
        instruction = fields[1].strip()
        mnemonic = instruction.split()[0]
        vex = mnemonic.startswith("v") and mnemonic not in ("verr", "verw")
        evex = "zmm" in instruction or "{k" in instruction or re.search(r"[xy]mm(1[6-9]|2\d|3[01])\b", instruction)
        if vex or evex:
            wide.setdefault(function, set()).add("evex" if evex else "vex")
    assert wide, "no AVX instruction at all: the avx2/avx512 kernel copies were not compiled"
    outside = [name for name in wide if "morphpipe::avx2::" not in name and "morphpipe::avx512::" not in name]
    assert not outside, f"AVX instructions outside the avx2/avx512 kernels: {outside[:5]}"
    avx512_in_avx2 = [name for name, kinds in wide.items() if "morphpipe::avx2::" in name and "evex" in kinds]
    assert not avx512_in_avx2, f"AVX-512 instructions in avx2 kernels: {avx512_in_avx2[:5]}"
