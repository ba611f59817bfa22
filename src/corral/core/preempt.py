"""Victim selection: whole gangs whose freed GPUs form one placement for a blocked job.

1. Each schedulable node's *potential* is its available GPUs plus what its candidate victims
   hold. The fast path bounds it from per-node aggregates (`Occupancy`): GPUs per (queue,
   class) of the attempts past their minimum run time, in the groups the `Victims` plugin's
   `group_eligible` allows, without visiting attempts. No group allowed: no candidates.
2. The tightest span whose domain holds the gang on potentials is chosen, and inside it the
   nodes cheapest to free: lowest class first, then least lost work (GPU-seconds since the
   last checkpoint).
3. Only on the chosen nodes are attempts checked one by one (`eligible`, `order_key`); if the
   bound was too optimistic there (a job inside its minimum run time, say), every running attempt
   is examined instead (the full scan), so the answer never depends on the shortcut.
4. The victims are released tentatively through the plan and the job is placed as usual;
   victims the placement does not touch are dropped; the plan is rolled back (victims keep
   running until they stop; the job is nominated to the placement).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum

from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.narrow import Narrowed, Overlay, narrowed, too_few
from corral.core.occupancy import COUNTED, Group
from corral.core.placement import NodeMask, Request, place
from corral.core.plugins import VictimFilter, Victims
from corral.core.reserved_victims import kept_for_reservations, reserved_short
from corral.core.served import use_index
from corral.core.state import ClusterState
from corral.core.victim_domain import FREE, Cost, choose_nodes
from corral.core.victim_nodes import NodesMemo, on_nodes


class Miss(Enum):
    """Victim selection found no set, and why (None: candidates, but no set frees one placement)."""

    NO_CANDIDATES = "no candidates"  # no running attempt can be a victim of the job at all
    RETRY = "retry"  # the aggregates' bound was too optimistic: examine every candidate


NO_CANDIDATES = Miss.NO_CANDIDATES
AMONG = True  # False: a ranking reads every attempt of a group that is not narrowed (tests compare)


@dataclass(slots=True)
class Selection:
    placement: list[NodeMask]
    victims: list[RunningAttempt]


# (preemptor key, groups) -> (queues' use version, candidates ranked): one cycle's rankings
Ranked = dict[Hashable, tuple[int, list[RunningAttempt]]]


def select_victims(
    state: ClusterState,
    plugin: Victims,
    job: PendingJob,
    req: Request,
    now: float,
    memo: Ranked | None = None,
    nodes_memo: NodesMemo | None = None,
) -> Selection | Miss | None:
    """Choose victims for `job`; None when no eligible set frees one placement, NO_CANDIDATES when
    no running attempt can be a victim at all. `memo`: the cycle's rankings (`ranked_candidates`);
    `nodes_memo`: where their candidates are (`victim_nodes.on_nodes`)."""
    ok = eligible_groups(state, plugin, job, now)
    if not ok:
        return NO_CANDIDATES  # `group_eligible` is an upper bound: no attempt of any group qualifies
    few = narrowed(state, plugin, job, now, ok)  # groups the plugin reads only some attempts of
    if plugin.bounds_by_group:
        fast = _by_aggregates(state, plugin, job, req, now, ok, few)
        if fast is not _RETRY:
            return fast
    return _full_scan(state, plugin, job, req, now, ok, memo, few, nodes_memo)


def eligible_groups(state: ClusterState, plugin: VictimFilter, job: PendingJob, now: float) -> set[Group]:
    """The (queue, class) groups whose candidates the plugin may take for `job`, at `now`."""
    state.occupancy.settle(now)
    return {key for key in state.occupancy.members if plugin.group_eligible(job, key[0], key[1], state, now)}


def ranked_candidates(
    state: ClusterState,
    plugin: Victims,
    job: PendingJob,
    now: float,
    ok: set[Group] | None = None,
    memo: Ranked | None = None,
    few: Narrowed | None = None,
) -> list[RunningAttempt]:
    """Every candidate of the groups in `ok` (None: the eligible groups) that the plugin allows as
    a victim of `job`, in its victim order (not one started at `now`); of a group in `few` (None:
    the plugin's `narrowed` groups), only its attempts there. With `memo` (one cycle's, at one
    `now`), computed once per preemptor key and groups while no queue's counted GPUs change (what
    the plugin reads of the attempts and queues changes only with them then: a start, a
    preemption, a nomination); after such a change, for a plugin that `ranks_by_attempt`, the
    ranking less the attempts that stopped being candidates (in a cycle, attempts only leave the
    candidates: a new one started at `now`). Nothing is remembered when a group is narrowed (the
    narrowing reads the preemptor beyond its key). The list is shared: callers do not change it."""
    if ok is None:
        ok = eligible_groups(state, plugin, job, now)
    if few is None:
        few = narrowed(state, plugin, job, now, ok)
    key: Hashable | None = None
    if memo is not None and not few:
        pkey = plugin.preemptor_key(job, now)
        if pkey is not None:
            key = (pkey, frozenset(ok))
            found = memo.get(key)
            if found is not None:
                if found[0] == state.use_version:
                    return found[1]
                if plugin.ranks_by_attempt:  # the same order, less the attempts no longer candidates
                    kept = [a for a in found[1] if a.candidate == COUNTED]
                    memo[key] = (state.use_version, kept)
                    return kept
    attempts = _candidates(state, plugin, job, now, ok, few)
    ranked = plugin.rank(job, attempts, state, now) if attempts else []
    if memo is not None and key is not None:
        memo[key] = (state.use_version, ranked)
    return ranked


def _candidates(
    state: ClusterState, plugin: Victims, job: PendingJob, now: float, ok: set[Group], few: Narrowed
) -> list[RunningAttempt]:
    """The attempts `ranked_candidates` ranks: of the groups in `ok` (of a narrowed group, its
    attempts in `few`), not started at `now`. For a plugin with a `service_floor` (the attained service
    every victim of the job has at least; `VictimFilter`), only those whose service may have
    reached it (`served.reaching`): the plugin would drop the others. For a plugin with a method
    `among(preemptor, group, state, now)` (`SameQueue` over `tiresias`: its `narrow`), only the
    attempts of a group it returns, a list holding every attempt of the group the plugin allows
    (None: the whole group); the ranking is the same (switch `AMONG`), but neither the bound nor
    the remembered rankings change: the group is not narrowed."""
    occupancy = state.occupancy
    floor = plugin.service_floor(job) if not few and use_index() else None
    if floor is not None:
        every = len(occupancy.members) == len(ok)
        return [
            a
            for a in occupancy.reaching.reaching(floor, now)
            if a.start < now and (every or (a.job.spec.queue, a.job.spec.priority) in ok)
        ]
    members = occupancy.members
    among = getattr(plugin, "among", None) if AMONG else None
    if among is None:
        return [a for g in ok for a in (few[g] if g in few else members[g].values()) if a.start < now]
    out: list[RunningAttempt] = []
    for g in ok:
        some = few.get(g)
        if some is None:
            some = among(job, g, state, now)
        out.extend(a for a in (members[g].values() if some is None else some) if a.start < now)
    return out


_RETRY = Miss.RETRY


def _by_class(item: tuple[Group, list[float]]) -> int:
    return item[0][1]


def _by_aggregates(
    state: ClusterState,
    plugin: Victims,
    job: PendingJob,
    req: Request,
    now: float,
    ok: set[Group],
    few: Narrowed,
) -> Selection | Miss | None:
    totals = state.occupancy.totals
    if not any(key in totals for key in ok):
        return NO_CANDIDATES
    g = max(1, req.gpus_per_replica)
    if too_few(state, ok, few, req.replicas, g):
        return None  # the free GPUs and the candidates' together hold too few replicas
    allowed = set(req.classes)
    avail = state.index.avail
    owed = reserved_short(state)
    node_class = state.node_class
    potential: dict[int, int] = {}
    node_groups = Overlay(state.occupancy.groups, few)  # narrowed groups: their few attempts
    read = node_groups.nodes(state, ok, req.classes, g)  # every group narrowed: where they are
    for node in range(len(state.occupancy.groups)) if read is None else read:
        have = (avail[node] - owed.get(node, 0) if owed else avail[node]) + node_groups.have(node, ok)
        if have >= g and node_class[node] in allowed and state.is_schedulable(node):
            potential[node] = have

    whole = req.per_node  # a per-node job starts alone: every attempt on its nodes must leave

    def cost(node: int, gpus: int) -> Cost:
        have = avail[node] - owed.get(node, 0)
        if have >= gpus and not (whole and state.alloc[node]):
            return FREE
        worst, lost = -(1 << 62), 0.0
        for (queue, priority), (count, since) in sorted(node_groups.at(node).items(), key=_by_class):
            if have >= gpus and not whole:
                break
            if (queue, priority) in ok:
                have += int(count)
                worst = max(worst, priority)
                lost += count * now - since
        return (worst, lost)

    verified: dict[int, list[RunningAttempt]] = {}
    for _ in range(4):  # the bound was too optimistic on some chosen node: tighten it there, choose again
        nodes = choose_nodes(state, req, potential, cost)
        if nodes is None:
            return None  # even the optimistic bound cannot hold the gang
        victims: dict[int, RunningAttempt] = {}
        short = False
        for node, gpus in nodes:
            have = avail[node] - owed.get(node, 0)
            candidates = verified.get(node)
            if candidates is None:
                candidates = verified[node] = _verified(state, plugin, job, node, now)
            left = state.alloc[node]
            for a in candidates:
                if have >= gpus and not (whole and left):
                    break
                victims.setdefault(id(a), a)
                have += sum(m.bit_count() for n, m in a.placement if n == node)
                left &= ~sum(m for n, m in a.placement if n == node)
            if have < gpus or (whole and left):
                short = True
                real = (
                    avail[node]
                    - owed.get(node, 0)
                    + sum(m.bit_count() for a in candidates for n, m in a.placement if n == node)
                )
                if real >= g and not (whole and left):
                    potential[node] = real
                else:
                    potential.pop(node, None)
        if not short:
            return _confirm(state, req, job, list(victims.values()))
    return _RETRY


def _verified(
    state: ClusterState, plugin: Victims, job: PendingJob, node: int, now: float
) -> list[RunningAttempt]:
    """The attempts on a node the plugin allows as victims, in its victim order."""
    attempts = state.occupancy.jobs[node].values()
    return plugin.rank(
        job, [a for a in attempts if a.preempting_deadline is None and a.start < now], state, now
    )


def _full_scan(
    state: ClusterState,
    plugin: Victims,
    job: PendingJob,
    req: Request,
    now: float,
    ok: set[Group] | None = None,
    memo: Ranked | None = None,
    few: Narrowed | None = None,
    nodes_memo: NodesMemo | None = None,
) -> Selection | Miss | None:
    """The exact path: every attempt of an eligible group (of a narrowed group, its attempts in
    `few`) is checked and ranked by the plugin.

    Only preemptible attempts that are not stopping are in groups, and `eligible` implies
    `group_eligible` (the groups in `ok`; None: every group), so this examines every running
    attempt that could be a victim.
    """
    candidates = ranked_candidates(
        state, plugin, job, now, set(state.occupancy.members) if ok is None else ok, memo, few
    )
    if not candidates:
        return NO_CANDIDATES
    g = max(1, req.gpus_per_replica)
    where = on_nodes(state, candidates, req.classes, nodes_memo, 0 if req.per_node else req.replicas, g)
    if where is None:
        return None  # the candidates and the free GPUs together hold too few replicas
    on_node, held_on = where
    avail = state.index.avail
    owed = reserved_short(state)
    potential = {n: avail[n] for n in state.index.nodes_by_avail(0, req.classes, g, True)}
    for node, held in held_on.items():
        potential[node] = avail[node] - owed.get(node, 0) + held

    whole = req.per_node  # a per-node job starts alone: every attempt on its nodes must leave
    if whole:  # so a node where some attempt may not be taken cannot hold it
        for node, entries in on_node.items():
            if state.alloc[node] & ~sum(m for _, a, _ in entries for n, m in a.placement if n == node):
                del potential[node]

    def cost(node: int, gpus: int) -> Cost:
        have, worst = avail[node] - owed.get(node, 0), -(1 << 62)
        for i, _, held in on_node.get(node, ()):
            if have >= gpus and not whole:
                break
            worst = max(worst, i)
            have += held
        return (worst, 0.0) if worst > FREE[0] else FREE

    nodes = choose_nodes(state, req, {n: p for n, p in potential.items() if p >= g}, cost)
    if nodes is None:
        return None
    needed: dict[int, RunningAttempt] = {}
    for node, gpus in nodes:
        have = avail[node] - owed.get(node, 0)
        for _, a, held in on_node.get(node, ()):
            if have >= gpus and not whole:
                break
            needed.setdefault(id(a), a)
            have += held
    return _confirm(state, req, job, list(needed.values()))


def _confirm(
    state: ClusterState, req: Request, job: PendingJob, victims: list[RunningAttempt]
) -> Selection | None:
    """Release the victims tentatively, place the job, keep only victims the placement touches."""
    state.victims_ordered += 1  # (which nodes were chosen read the victims' order)
    checkpoint = state.plan.checkpoint()
    for a in victims:
        for node, mask, cpus, memory in state.attempt_resources(a):
            state.give_back(node, mask, cpus, memory, a.exclusive)
    placed = place(state, req, job.avoid_nodes)
    state.plan.rollback(checkpoint)
    if not isinstance(placed, list):
        return None
    used: dict[int, int] = {}
    for node, mask in placed:  # a per-node job takes its nodes whole (it starts alone there)
        used[node] = -1 if req.per_node else used.get(node, 0) | mask
    kept = [a for a in victims if any(used.get(n, 0) & m for n, m in a.placement)]
    if state.reserved_at and not req.per_node and len(kept) < len(victims):
        more = kept_for_reservations(state, victims, kept, used)
        if more:
            kept = [a for a in victims if id(a) in more or any(used.get(n, 0) & m for n, m in a.placement)]
    return Selection(placed, kept)
