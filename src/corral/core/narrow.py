"""Groups of candidate victims that a policy narrows to a few of their attempts.

Victim selection bounds what each node could free from per-(queue, class) aggregates of every
candidate (`Occupancy`). A policy that may take only some candidates of a group (`tiresias`: of
its own queue and class, only jobs in a worse level that would lose little work) makes that
bound loose, and victim selection then retries and falls back to examining every candidate of
the group. Such a plugin has a method `narrow(preemptor, group, state, now)` that returns, for a
group, a list of attempts that holds every one it may take there (None: the whole group); the
bound and the full scan then read those attempts instead of the group. A plugin without the
method narrows nothing, and victim selection decides exactly as without this module.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.occupancy import Group
from corral.core.state import ClusterState

Narrowed = dict[Group, list[RunningAttempt]]
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
