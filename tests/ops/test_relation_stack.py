"""Means and sums over several relations into one node type: per relation and stacked give the reference's values and
gradients, and the option timed faster is kept per shape."""
from __future__ import annotations

import pytest
import torch

from morphpipe.ops.choice import choice_counts, clear_choices, force_choices, recorded_choices
from morphpipe.ops import relation_stack
from morphpipe.ops.graph_kernel import use_timer
from morphpipe.ops.relation_stack import relation_aggregates, stack_blocks
from morphpipe.sampling.minibatch import Block
from tests.ops.conftest import EDGE_CASES, NUM_SRC, features, make_block

NUM_DST = 5
# three relations into one type: two read "a" (one of them with fewer destinations), one "b", one with no edges
BLOCKS = [make_block(EDGE_CASES, NUM_SRC), make_block([[3], [1, 1, 0], [2]], 4),
          make_block([[6], [], [0, 6, 5], [], []], NUM_SRC), make_block([[]] * NUM_DST, NUM_SRC)]
SOURCES = ["a", "b", "a", "a"]


def reference(block: Block, rows: torch.Tensor, reduce: str) -> torch.Tensor:
    """Dense adjacency (row-normalised for mean) times the rows."""
    matrix = torch.zeros(block.num_dst, rows.shape[0], dtype=rows.dtype)
    dst = torch.repeat_interleave(torch.arange(block.num_dst), block.indptr[1:] - block.indptr[:-1])
    matrix.index_put_((dst, block.indices), torch.ones(block.nnz, dtype=rows.dtype), accumulate=True)
    if reduce == "mean":
        matrix = matrix / matrix.sum(1, keepdim=True).clamp(min=1)
    return matrix @ rows.flatten(1)


@pytest.mark.parametrize("option", ["per_relation", "stacked"])
@pytest.mark.parametrize("reduce", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(3,), (2, 4)], ids=["width3", "heads2x4"])
def test_each_option_gives_the_reference_values_and_gradients(option, reduce, shape) -> None:
    rows = {"a": features(1, NUM_SRC, *shape).requires_grad_(), "b": features(2, 4, *shape).requires_grad_()}
    with force_choices({"hetero.relations": option}):
        clear_choices()
        outs = relation_aggregates(BLOCKS, SOURCES, rows, NUM_DST, reduce)
    assert choice_counts()["hetero.relations"] == {option: 1}
    weights = [features(10 + k, *out.shape) for k, out in enumerate(outs)]
    sum((out * w).sum() for out, w in zip(outs, weights)).backward()
    ours = {name: value.grad.clone() for name, value in rows.items()}
    for value in rows.values():
        value.grad = None
    expected = [reference(block, rows[source], reduce) for block, source in zip(BLOCKS, SOURCES)]
    sum((out * w.flatten(1)).sum() for out, w in zip(expected, weights)).backward()
    for k, (out, block) in enumerate(zip(outs, BLOCKS)):
        assert out.shape == (block.num_dst, *shape)
        torch.testing.assert_close(out.flatten(1), expected[k], msg=f"relation {k}")
    for name, value in rows.items():
        torch.testing.assert_close(ours[name], value.grad, msg=f"gradient of {name}")


def test_stacked_block_offsets_each_source_type_and_pads_short_relations() -> None:
    block, types = stack_blocks(BLOCKS[:3], SOURCES[:3], {"a": NUM_SRC, "b": 4}, NUM_DST)
    assert types == ["a", "b"] and (block.num_src, block.num_dst) == (NUM_SRC + 4, 3 * NUM_DST)
    assert block.indptr.tolist() == [0, 0, 3, 3, 5, 7, 8, 11, 12, 12, 12, 13, 13, 16, 16, 16]
    assert block.indices[7:12].tolist() == [3 + NUM_SRC, 1 + NUM_SRC, 1 + NUM_SRC, NUM_SRC, 2 + NUM_SRC]


@pytest.mark.parametrize("faster", ["per_relation", "stacked"])
def test_the_option_timed_faster_is_kept_for_its_shape(faster) -> None:
    rows = {"a": features(1, NUM_SRC, 3), "b": features(2, 4, 3)}
    timed = []

    def timer(option, run):
        run()  # the option runs forward and backward on detached copies
        timed.append(option)
        return 1.0 if option == faster else 2.0

    clear_choices()
    with use_timer(timer):
        first = relation_aggregates(BLOCKS, SOURCES, rows, NUM_DST, "mean")
        again = relation_aggregates(BLOCKS, SOURCES, rows, NUM_DST, "mean")
    assert sorted(timed) == ["per_relation", "stacked"], "each option timed once, for the first call of the shape"
    assert choice_counts()["hetero.relations"] == {faster: 2}
    assert rows["a"].grad is None and not first[0].requires_grad, "timing leaves the call's rows and graph alone"
    for ours, expected in zip(again, [reference(block, rows[s], "mean") for block, s in zip(BLOCKS, SOURCES)]):
        torch.testing.assert_close(ours, expected)


def test_timing_gives_a_gradient_only_to_the_rows_that_need_one(monkeypatch) -> None:
    """Input features need no gradient: per relation their backward is skipped, and the timing must see that."""
    rows = {"a": features(1, NUM_SRC, 3), "b": features(2, 4, 3).requires_grad_()}
    seen, original = [], relation_stack.aggregate

    def aggregate(block, table, reduce):
        seen.append((table.shape[0], table.requires_grad))
        return original(block, table, reduce)

    monkeypatch.setattr(relation_stack, "aggregate", aggregate)
    clear_choices()
    with use_timer(lambda option, run: run() or (1.0 if option == "stacked" else 2.0)):
        outs = relation_aggregates(BLOCKS, SOURCES, rows, NUM_DST, "mean")
    assert seen[:3] == [(NUM_SRC, False), (4, True), (NUM_SRC, False)], "per relation, timed as the call's rows"
    assert seen[3] == (NUM_SRC + 4, True) and seen[4] == seen[3], "stacked timed, then run"
    assert [out.requires_grad for out in outs] == [True, True, True, False]


def test_the_real_timer_picks_an_option_and_the_values_hold() -> None:
    rows = {"a": features(1, NUM_SRC, 3).requires_grad_(), "b": features(2, 4, 3).requires_grad_()}
    clear_choices()
    outs = relation_aggregates(BLOCKS, SOURCES, rows, NUM_DST, "sum")
    assert sum(choice_counts()["hetero.relations"].values()) == 1
    (record,) = [r for r in recorded_choices() if r.decision == "hetero.relations"]
    assert record.reason == "timed" and set(dict(record.costs)) == {"per_relation", "stacked"}
    for ours, block, source in zip(outs, BLOCKS, SOURCES):
        torch.testing.assert_close(ours, reference(block, rows[source].detach(), "sum"))


def test_rows_of_different_widths_run_per_relation_and_refuse_forced_stacking() -> None:
    rows = {"a": torch.zeros(NUM_SRC, 3), "b": torch.zeros(4, 5)}
    clear_choices()
    relation_aggregates(BLOCKS[:2], SOURCES[:2], rows, NUM_DST, "sum")
    assert choice_counts()["hetero.relations"] == {"per_relation": 1}
    with force_choices({"hetero.relations": "stacked"}), pytest.raises(ValueError, match="cannot run on this input"):
        relation_aggregates(BLOCKS[:2], SOURCES[:2], rows, NUM_DST, "sum")


def test_bad_reduce_and_too_few_destinations_are_refused() -> None:
    rows = {"a": torch.zeros(NUM_SRC, 3), "b": torch.zeros(4, 3)}
    with pytest.raises(ValueError, match=r"reduce='max'.*use one of \['sum', 'mean'\]"):
        relation_aggregates(BLOCKS[:2], SOURCES[:2], rows, NUM_DST, "max")
    with pytest.raises(ValueError, match="num_dst=4 is fewer than a block's destinations"):
        relation_aggregates(BLOCKS[:2], SOURCES[:2], rows, 4, "sum")

