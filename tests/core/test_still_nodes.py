"""A change of reserved GPUs alone skips the index move of a node that offers nothing before and
after it (`nodes.STILL_NODES`): on random clusters (cordoned nodes, unhealthy GPUs, NVLink
groups) through random changes (GPUs taken and given back, held, reserved GPUs added, taken back,
set and dropped, rollbacks to random checkpoints), the index and the NVLink index say after every
change what the masks and reserved counts say (`_expected`), and the node version moves at every
change of reserved GPUs (`reserve.misses_lifted` keys its memory on it). Whole histories decide
alike with the switch on and off: `tests/core/test_preemption_switches.py`."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import nodes
from corral.core.state import ClusterState
from tests.core.test_reserve_exact import clusters


def _expected(state: ClusterState, node: int) -> tuple[int, int]:
    """What the index and the NVLink index should offer of a node, from the masks."""
    free = state.healthy[node] & ~state.alloc[node] & ~state.held[node]
    if not state.is_schedulable(node) or state.exclusive[node]:
        return 0, 0
    avail = max(0, free.bit_count() - state.reserved[node])
    masks = state.group_masks[node]
    if avail == 0 or len(masks) <= 1:
        return avail, 0 if avail == 0 else state.nvl_index.avail[node]
    return avail, min(avail, max((free & m).bit_count() for m in masks))


def _check(state: ClusterState) -> None:
    for node in range(len(state.specs)):
        avail, nvl = _expected(state, node)
        assert state.index.avail[node] == avail, node
        if len(state.group_masks[node]) > 1 or avail == 0:
            assert state.nvl_index.avail[node] == nvl, node
        assert state.reserved_at.get(node, 0) == state.reserved[node]


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["take", "give", "hold", "add", "back", "set", "drop", "mark", "undo"]),
        st.integers(0, 63),
        st.integers(0, 255),
        st.integers(1, 9),
    ),
    min_size=10,
    max_size=80,
)


@pytest.mark.parametrize("still", [True, False])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=clusters(), ops=_OPS)
def test_the_index_says_what_the_masks_say(
    still: bool, state: ClusterState, ops: list[tuple[str, int, int, int]]
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nodes, "STILL_NODES", still)
        _run(state, ops)


def _run(state: ClusterState, ops: list[tuple[str, int, int, int]]) -> None:
    n, gpus = len(state.specs), state.specs[0].gpus
    marks: list[int] = []
    for op, at, bits, count in ops:
        node, mask = at % n, bits & ((1 << gpus) - 1)
        version = state.node_version
        free = state.healthy[node] & ~state.alloc[node] & ~state.held[node]
        if op == "take" and mask & free == mask and mask:
            state.take(node, mask, 0, 0.0, False)
        elif op == "give" and state.alloc[node] & mask == mask and mask:
            state.give_back(node, mask, 0, 0.0, False)
        elif op == "hold":
            state.set_held(node, state.held[node] | (mask & free))
        elif op in ("add", "back"):
            picked = tuple((m, 1 + (count + m) % gpus) for m in range(node, min(n, node + 1 + count % 3)))
            if op == "back":
                picked = tuple((m, min(g, state.reserved[m])) for m, g in picked)
            state.add_reserved(picked, 1 if op == "add" else -1)
            assert state.node_version > version
        elif op == "set":
            state.set_reserved(node, count % (free.bit_count() + 2))
            assert state.node_version > version
        elif op == "drop":
            state.drop_reserved(tuple((m, 0) for m in range(node, min(n, node + count))))
        elif op == "mark":
            marks.append(state.plan.checkpoint())
        elif op == "undo" and marks:
            i = count % len(marks)
            state.plan.rollback(marks[i])
            del marks[i:]
        _check(state)
    state.plan.rollback(0)
    _check(state)
