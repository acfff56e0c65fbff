"""The hardware ceilings benchmarks compare against: a step's recorded GEMM shapes and the measurements' units."""
from __future__ import annotations

import pytest
import torch

from morphpipe.profiler.ceiling import (GemmShape, measure_copy_bandwidth, measure_gemm, measure_row_gather,
                                        recorded_gemm_shapes, share, training_step_gemm_shapes)


def test_recorded_shapes_are_the_products_run():
    a, b, c = torch.randn(5, 3), torch.randn(3, 4), torch.randn(5, 4)
    shapes = recorded_gemm_shapes(lambda: (a @ b, a @ b, torch.addmm(c, a, b)))
    assert shapes == [GemmShape(5, 3, 4, 3)]
    assert shapes[0].flops == 3 * 2 * 5 * 3 * 4


def test_step_shapes_come_from_a_real_batch(tiny):
    shapes = training_step_gemm_shapes(tiny, "sage", batch_size=32, fanouts=(3, 2, 2))
    # The first layer projects the input features; the last produces the class scores.
    assert any(shape.k == tiny.feature_dim for shape in shapes)
    assert any(shape.n == tiny.num_classes or shape.m == tiny.num_classes for shape in shapes)
    ceiling = measure_gemm(shapes, torch.bfloat16, repeats=1)
    assert ceiling.dtype == "bfloat16" and ceiling.gflop_per_s > 0


def test_memory_measurements_are_positive_rates():
    assert measure_copy_bandwidth(1 << 20, repeats=1) > 0
    assert measure_row_gather(256, table_bytes=1 << 20, rows=1000, repeats=1) > 0
    with pytest.raises(ValueError, match="row_bytes=255"):
        measure_row_gather(255)


def test_share_and_empty_shapes():
    assert share(11.6, 26.0) == "45%"
    with pytest.raises(ValueError, match="no GEMM shapes"):
        measure_gemm([], torch.float32)



def test_isa_flags_lists_the_flags_that_matter_in_order(tmp_path):
    from morphpipe.profiler.ceiling import isa_flags

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: X\nflags\t\t: fpu sse2 avx512f fma avx2 amx_bf16 avx512_bf16\nflags : avx512bw\n")
    assert isa_flags(str(cpuinfo)) == ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]
    assert isa_flags(str(tmp_path / "absent")) == []
