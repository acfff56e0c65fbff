"""The dataset fingerprint's sampled positions stay inside the tensor at every size."""
from __future__ import annotations

import pytest

from morphpipe.data.fingerprint import SAMPLED_ENTRIES, sampled_positions


@pytest.mark.parametrize("numel", [1, 2, 4095, 4096, 4097, 19_916_704, 1_615_685_872, 2**40 + 3])
def test_positions_run_from_the_first_to_the_last_entry(numel: int) -> None:
    positions = sampled_positions(numel)
    assert len(positions) == min(SAMPLED_ENTRIES, numel)
    assert int(positions[0]) == 0 and int(positions[-1]) == numel - 1  # bench-1m's 19,916,704 edges went past the end
    assert bool((positions[1:] >= positions[:-1]).all())
