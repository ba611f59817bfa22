"""Groups of candidate victims that a policy narrows to a few of their attempts.

Victim selection bounds what each node could free from per-(queue, class) aggregates of every
candidate (`Occupancy`). A policy that may take only some candidates of a group (`tiresias`: of
its own queue and class, only jobs in a worse level that would lose little work) makes that
bound loose, and victim selection then retries and falls back to examining every candidate of
the group. Such a plugin has a method `narrow(preemptor, group, state, now)` that returns, for a
group, a list of attempts that holds every one it may take there (None: the whole group); the
bound and the full scan then read those attempts instead of the group. A plugin without the
method narrows nothing, and victim selection decides exactly as without this module.

Before reading the aggregates node by node, the bound first checks that the free GPUs and every
candidate's together hold the job's replicas at all (`too_few`, switch `FEW_FIRST`); and the
narrowed groups' aggregates are read per node where needed (`have`, `Overlay`) instead of
copying every node's aggregates that a narrowed group touches (switch `LAZY_OVERLAY`). When
every group allowed is narrowed, the bound reads only the nodes their attempts touch and those
with enough free GPUs (`Overlay.nodes`, switch `FEW_NODES`): on another node the groups hold
nothing and the free GPUs are too few, so it has no potential.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.occupancy import Group
from corral.core.state import ClusterState

FEW_FIRST = True  # False: the aggregates are read even where they cannot hold the job (tests compare)
LAZY_OVERLAY = True  # False: every node's narrowed aggregates copied first (`overlay`; tests compare)
FEW_NODES = True  # False: the bound reads every node even when every group is narrowed (tests compare)

Narrowed = dict[Group, list[RunningAttempt]]
Aggregates = dict[Group, list[float]]  # per group [GPUs, sum of GPUs x (last checkpoint or start)]
_NONE: Narrowed = {}


def narrowed(
    state: ClusterState, plugin: object, job: PendingJob, now: float, ok: Iterable[Group]
) -> Narrowed:
    """The groups of `ok` the plugin narrows, with their attempts (empty: none narrowed)."""
    narrow = getattr(plugin, "narrow", None)
    if narrow is None:
        return _NONE
    found: Narrowed = {}
    for key in sorted(ok):  # a set: sorted, so that the narrowed groups' order never varies by run
        attempts = narrow(job, key, state, now)
        if attempts is not None:
            found[key] = attempts
    return found


def per_node(groups: Narrowed) -> dict[int, dict[Group, list[float]]]:
    """Per node, the narrowed groups' [GPUs, sum of GPUs x (last checkpoint or start)] there, as
    `Occupancy.groups` holds them for whole groups."""
    out: dict[int, dict[Group, list[float]]] = {}
    for key, attempts in groups.items():
        for a in attempts:
            since = max(a.start, a.last_checkpoint)
            for node, mask in a.placement:
                gpus = mask.bit_count()
                at = out.setdefault(node, {})
                entry = at.get(key)
                if entry is None:
                    entry = at[key] = [0.0, 0.0]
                entry[0] += gpus
                entry[1] += gpus * since
    return out


def overlay(groups: list[dict[Group, list[float]]], few: Narrowed) -> list[dict[Group, list[float]]]:
    """`Occupancy.groups` (per node, per group [GPUs, GPUs x since]) with each narrowed group
    counting only its attempts in `few` (the same list when nothing is narrowed)."""
    if not few:
        return groups
    out = list(groups)
    extra = per_node(few)
    for node, at in enumerate(out):
        if node in extra or any(key in at for key in few):
            mine = {key: entry for key, entry in at.items() if key not in few}
            mine.update(extra.get(node, {}))
            out[node] = mine
    return out


def too_few(state: ClusterState, ok: set[Group], few: Narrowed, replicas: int, per_replica: int) -> bool:
    """Whether the free GPUs and what the candidates of the groups in `ok` hold (of a narrowed
    group, its attempts in `few`), together, make fewer than `replicas` replicas of `per_replica`
    GPUs: then `preempt._by_aggregates` finds no nodes (a node's potential is at most its free GPUs
    plus its candidates' GPUs there, `sum(p // g) <= sum(p) // g`, and a per-node job needs
    `replicas` nodes of `g` GPUs or more). A running attempt holds `spec.gpus` GPUs in all."""
    if not FEW_FIRST:
        return False
    totals = state.occupancy.totals
    held = 0
    for key in ok:
        attempts = few.get(key)
        if attempts is None:
            held += int(totals.get(key, 0.0))
        else:
            for a in attempts:
                held += a.spec.gpus
    return (sum(state.index.avail) + held) // per_replica < replicas


class Overlay:
    """`overlay`'s answer read node by node (`at`): each node's aggregates, with each narrowed
    group counting only its attempts in `few`: the same dicts in the same order (victim selection's
    costs sum them in that order), built only for the nodes read (`LAZY_OVERLAY`; else all at
    once); `have` sums a node's GPUs of some groups without building its dict."""

    __slots__ = ("built", "eager", "extra", "few", "groups")

    def __init__(self, groups: list[Aggregates], few: Narrowed) -> None:
        self.groups = groups
        self.few = few
        lazy = bool(few) and LAZY_OVERLAY
        self.extra = per_node(few) if lazy else {}
        self.eager = None if lazy else overlay(groups, few)
        self.built: dict[int, Aggregates] = {}

    def nodes(
        self, state: ClusterState, ok: set[Group], classes: Iterable[int], gpus: int
    ) -> list[int] | None:
        """The nodes that may have `gpus` GPUs or more of potential when every group of `ok` is
        narrowed, in order: those their attempts in `few` touch and those with `gpus` GPUs or more
        available in the classes (`FreeIndex`); None (every node) otherwise."""
        few = self.few
        if not (FEW_NODES and few and self.eager is None) or any(key not in few for key in ok):
            return None
        found = set(self.extra)
        found.update(state.index.nodes_by_avail(0, classes, gpus, False))
        return sorted(found)

    def have(self, node: int, ok: set[Group]) -> int:
        """The GPUs that the groups of `ok` hold on the node (a narrowed one: its attempts in `few`)."""
        have = 0
        if self.eager is not None:
            for key, entry in self.eager[node].items():
                if key in ok:
                    have += int(entry[0])
            return have
        few = self.few
        for key, entry in self.groups[node].items():
            if key in ok and key not in few:
                have += int(entry[0])
        extra = self.extra.get(node)
        if extra is not None:
            for key, entry in extra.items():
                if key in ok:
                    have += int(entry[0])
        return have

    def at(self, node: int) -> Aggregates:
        """The node's entry of `overlay(groups, few)`."""
        if self.eager is not None:
            return self.eager[node]
        found = self.built.get(node)
        if found is None:
            at, few = self.groups[node], self.few
            found = at
            if node in self.extra or any(key in at for key in few):
                found = {key: entry for key, entry in at.items() if key not in few}
                found.update(self.extra.get(node, {}))
            self.built[node] = found
        return found
