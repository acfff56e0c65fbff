"""The disk's measured read rates and the hit ratio of a static hot-row cache by cache size."""
from __future__ import annotations

import pytest
import torch

from morphpipe.profiler.disk import hit_ratio_by_cache_size, measure_disk_reads, presampled_hit_ratios
from tests.conftest import make_graph


def test_hit_ratio_by_cache_size_matches_a_count_by_hand():
    hotness = torch.tensor([0, 9, 3, 3, 0, 1])  # hot order: 1, 2, 3, 5, 0, 4
    gathered = [torch.tensor([1, 2, 0]), torch.tensor([3, 4, 1, 5])]
    # k=1 caches {1}: 2 of 7 rows; k=2 {1,2}: 3; k=3 {1,2,3}: 4; k=4 adds 5: 5; all 6: 7.
    assert hit_ratio_by_cache_size(hotness, gathered, [0, 1, 2, 3, 4, 6]) == [0, 2 / 7, 3 / 7, 4 / 7, 5 / 7, 1.0]


def test_presampled_hit_ratios_grow_with_the_cache_to_one():
    graph = make_graph(400)
    ratios = presampled_hit_ratios(graph, [4, 3], 32, 3, [0, 40, 200, 400])
    assert ratios[0] == 0.0 and ratios[-1] == 1.0
    assert ratios == sorted(ratios)


def test_disk_read_rates_are_measured_on_a_file(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(bytes(64 * 4096))
    try:
        facts = measure_disk_reads(path, queue_depth=4, seconds=0.05, sequential_block=16 * 4096)
    except RuntimeError as error:
        if "O_DIRECT" not in str(error):
            raise
        pytest.skip(f"this filesystem refuses O_DIRECT: {error}")
    assert facts.random_reads_per_s > 0 and facts.sequential_bytes_per_s > 0
    assert facts.random_bytes_per_s == facts.random_reads_per_s * 4096
    with pytest.raises(RuntimeError, match="holds 262144 bytes, less than one 4194304-byte block"):
        measure_disk_reads(path, queue_depth=1, seconds=0.01)  # the default sequential block
    with pytest.raises(ValueError, match="queue_depth"):
        measure_disk_reads(path, queue_depth=0)
