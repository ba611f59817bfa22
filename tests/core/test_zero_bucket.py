"""The free-count index keeps bucket 0 empty (`index.ZERO_BUCKET` off): nodes with no GPU
available are in no bucket, so a full cluster's nodes cost nothing to move in and out of it. Every
answer of the index for 1 GPU or more is the one of the index that keeps them (random domains,
classes and moves, to and from 0 included), and whole histories decide the same: the random
histories of `test_repeats.play` and the busy clusters of `test_preemption_memo.busy`, with the
bucket kept and without, walked and looked at job by job (every decision and reason equal)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import index, repeats
from corral.core.index import FreeIndex
from tests.core.test_preemption_memo import busy
from tests.core.test_repeats import play


def _index(zero: bool, classes: list[int], nodes: list[tuple[int, int]], domains: int) -> FreeIndex:
    """An index of `nodes` ((class, leaf domain) each, under the root), bucket 0 kept or not."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(index, "ZERO_BUCKET", zero)
        built = FreeIndex()
        for gpus in classes:
            built.add_class(gpus)
        for _ in range(domains):
            built.add_domain()
        for node, (cls, leaf) in enumerate(nodes):
            built.add_node(node, cls, (0, leaf))
    return built


def _answers(idx: FreeIndex, domains: int, classes: list[int]) -> list[object]:
    """Every question the index answers, for every domain, class set and need of 1 GPU or more."""
    out: list[object] = []
    sets = [(c,) for c in range(len(classes))] + [tuple(range(len(classes)))]
    most = max(classes)
    for dom in range(domains):
        for cls in sets:
            for need in range(1, 2 * most + 2):
                out.append(idx.best_fit(dom, cls, need))
                out.append(idx.nodes_by_avail(dom, cls, need, need % 2 == 0))
            for g in range(1, most + 1):
                out.append(idx.capacity(dom, cls, g))
                for replicas in range(1, 4):
                    out.append(idx.nodes_needed(dom, cls, g, replicas))
            out.append(idx.nodes_by_avail(dom, cls, 0, True))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_an_index_without_bucket_0_answers_as_one_with_it(data: st.DataObject) -> None:
    classes = data.draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3))
    leaves = data.draw(st.integers(1, 4))
    n_nodes = data.draw(st.integers(1, 12))
    nodes = [
        (data.draw(st.integers(0, len(classes) - 1)), 1 + data.draw(st.integers(0, leaves - 1)))
        for _ in range(n_nodes)
    ]
    domains = 1 + leaves
    kept, empty = _index(True, classes, nodes, domains), _index(False, classes, nodes, domains)
    assert _answers(kept, domains, classes) == _answers(empty, domains, classes)
    for _ in range(data.draw(st.integers(1, 30))):
        node = data.draw(st.integers(0, n_nodes - 1))
        new = data.draw(st.integers(0, classes[nodes[node][0]]))  # (0 often: a reservation held)
        kept.move(node, new)
        empty.move(node, new)
        assert kept.avail == empty.avail
        assert _answers(kept, domains, classes) == _answers(empty, domains, classes)
        for per_kept, per_empty in zip(kept.buckets, empty.buckets, strict=True):
            for cls, bl in per_empty.items():
                assert bl[0] == []
                assert bl[1:] == per_kept[cls][1:]


def _both(run: Any, *args: Any, walk: bool) -> tuple[Any, Any]:
    """The run without bucket 0 (the shortcut) and with it (`test_preemption_memo.both`, whose
    switch turns a shortcut off: here the switch turns the long way on)."""
    with pytest.MonkeyPatch.context() as patch:
        if not walk:
            patch.setattr(repeats, "MANY_SHAPES", -1)
        patch.setattr(index, "ZERO_BUCKET", False)
        shortcut = run(*args)
        patch.setattr(index, "ZERO_BUCKET", True)
        long_way = run(*args)
    return shortcut, long_way


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "las", "tiresias"]),
    limits=st.sampled_from([0, 4, 12]),
    walk=st.booleans(),
)
def test_histories_decide_as_with_bucket_0(seed: int, policy: str, limits: int, walk: bool) -> None:
    shortcut, long_way = _both(play, seed, policy, limits, walk=walk)
    assert shortcut == long_way


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["default", "las"]), walk=st.booleans())
def test_busy_clusters_decide_as_with_bucket_0(seed: int, policy: str, walk: bool) -> None:
    shortcut, long_way = _both(busy, seed, policy, walk=walk)
    assert shortcut == long_way
