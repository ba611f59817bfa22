"""Answers per job shape that hold until static capacity (nodes, queues) changes (`Caches`),
kept by the state (`ClusterState.caches`, `nodes.NodeTable`) and replaced whole then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.core.decisions import Reason
    from corral.core.placement import Request


@dataclass(slots=True)
class Caches:
    """Answers per job shape that hold until static capacity (nodes, queues) changes: the state
    replaces them all then (`ClusterState.caches`)."""

    # placement request per job shape (`request.request_for`)
    requests: dict[tuple[object, ...], Request] = field(default_factory=dict)
    # why a job can never fit, per verdict key; None: it can (`cycle`)
    never_fits: dict[int, str | None] = field(default_factory=dict)
    # most replicas one domain of a span holds when empty, per (request, span) (`request`)
    static_capacity: dict[tuple[Request, int], int] = field(default_factory=dict)
    any_quota: bool | None = None  # whether any queue has a quota (`fairshare`)
    # every queue's borrowing room, at the queues' use version it was computed for (`fairshare`)
    borrow_rooms: tuple[int, dict[str, tuple[int, int]]] | None = None
    # the queues that lend none of their idle quota, as last computed (`fairshare.reclaiming`)
    reclaiming: frozenset[str] = frozenset()
    # per family id (`PendingJob.family`, never given to another key): the id of its (shape,
    # queue, class) in `base_ids`, and its preemptibility (`first_told.FirstTold.twins`)
    family_bases: dict[int, tuple[int, bool]] = field(default_factory=dict)
    base_ids: dict[tuple[object, ...], int] = field(default_factory=dict)
    # capacity sentences by what they read (`capacity_reasons.Sentences`): (request, sentence, its parts)
    sentences: dict[tuple[object, ...], tuple[Request, Reason, tuple[str, str] | None]] = field(
        default_factory=dict
    )
