"""The shadow replay's comparison on hand-written logs: first starts, shapes, ranks and waits."""

from __future__ import annotations

import math
from typing import Any

from corral.fleet.shadow import compare, first_starts, live_timing, table

CLUSTER = {"seq": 1, "event": "cluster", "nodes": [{"name": "a", "gpus": 8}, {"name": "b", "gpus": 8}]}


def log(*entries: tuple[Any, ...]) -> list[dict[str, Any]]:
    """(event, t, job[, placement]) -> an event log with sequence numbers."""
    out: list[dict[str, Any]] = [CLUSTER]
    for i, (kind, t, job, *rest) in enumerate(entries, start=2):
        event: dict[str, Any] = {"seq": i, "event": kind, "t": t, "job": job}
        if kind != "submit":
            event["attempt"] = 1
        if rest:
            event["placement"] = [{"node": node, "gpus": gpus} for node, gpus in rest[0]]
        out.append(event)
    return out


SIM = log(
    ("submit", 0.0, "x"),
    ("start", 0.0, "x", [("a", [0, 1])]),
    ("submit", 1.0, "y"),
    ("start", 1.0, "y", [("a", [2])]),
    ("finish", 2.0, "x"),
    ("submit", 3.0, "z"),
    ("start", 3.0, "z", [("a", [0, 1, 3, 4, 5, 6, 7]), ("b", [0])]),
)


def test_first_starts_carry_waits_ranks_and_shapes() -> None:
    starts = first_starts(SIM)
    assert [starts[k].rank for k in "xyz"] == [0, 1, 2]
    assert starts["y"].wait == 0.0
    assert starts["y"].shape == ((6, 1),)  # node a had 6 free GPUs when y took one
    assert starts["z"].shape == ((7, 7), (8, 1))  # x had ended: a was back to 7 free


def test_identical_logs_agree_entirely() -> None:
    c = compare(first_starts(SIM), first_starts(SIM), tolerance=0.1)
    assert (c.jobs, c.same_placement, c.same_shape, c.identical_prefix) == (3, 1.0, 1.0, 3)
    assert c.rank_correlation == 1.0 and c.wait_diff_max == 0.0
    assert "same first placement" in table({"self": c})


def test_a_live_log_is_mapped_to_trace_ids_and_shifted_to_its_origin() -> None:
    live = log(
        ("submit", 100.0, "j1"),
        ("start", 100.02, "j1", [("a", [0, 1])]),
        ("submit", 101.0, "j2"),
        ("start", 101.03, "j2", [("b", [0])]),  # an equally good node? no: b had 8 free, a 6
        ("finish", 102.1, "j1"),
        ("submit", 103.0, "j3"),
        ("start", 103.5, "j3", [("a", [0, 1, 3, 4, 5, 6, 7]), ("b", [1])]),
    )
    names = {"j1": "x", "j2": "y", "j3": "z"}
    starts = first_starts(live, names, origin=100.0)
    c = compare(first_starts(SIM), starts, tolerance=0.1)
    assert c.jobs == 3 and c.same_placement == 1 / 3
    assert math.isclose(c.same_shape, 1 / 3)  # y: b had 8 free live, a 6 simulated; z: a had 8 live
    assert c.waited_sim == 0 and c.waited_live == 1  # z waited 0.5 s live
    assert math.isclose(c.wait_diff_max, 0.5, abs_tol=1e-9)
    assert live_timing(live, names, 100.0)["x"] == (0.0, 102.1 - 100.02)


def test_a_different_order_lowers_the_rank_correlation() -> None:
    other = log(
        ("submit", 0.0, "x"),
        ("submit", 1.0, "y"),
        ("submit", 3.0, "z"),
        ("start", 3.0, "z", [("b", [0])]),
        ("start", 3.0, "y", [("b", [1])]),
        ("start", 3.0, "x", [("a", [0, 1])]),
    )
    c = compare(first_starts(SIM), first_starts(other), tolerance=0.1)
    assert c.rank_correlation == -1.0 and c.identical_prefix == 0
    assert c.waited_live == 2 and c.on_arrival_latency_p99 == 3.0
