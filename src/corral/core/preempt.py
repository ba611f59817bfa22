"""Victim selection: whole gangs whose freed GPUs form one placement for a blocked job.

1. Candidates are the running attempts the `Victims` plugin allows, taken in its order.
2. Each schedulable node's *potential* is its available GPUs plus its candidates' GPUs; the
   tightest span whose domain can hold the gang on potentials is chosen, and inside it the
   nodes that are cheapest to free (lowest class first, then least lost work).
3. The victims those nodes need are released tentatively through the plan and the job is
   placed as usual; victims the placement does not touch are dropped; the plan is rolled back
   (victims keep running until they stop; the job is nominated to the placement).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from corral.core.jobs import PendingJob, RunningAttempt
from corral.core.placement import NodeMask, Request, place
from corral.core.plugins import Victims
from corral.core.state import ClusterState


@dataclass(slots=True)
class Selection:
    placement: list[NodeMask]
    victims: list[RunningAttempt]


NO_CANDIDATES = "no candidates"


def select_victims(
    state: ClusterState, plugin: Victims, job: PendingJob, req: Request, now: float
) -> Selection | str | None:
    """Choose victims for `job`; None when no eligible set frees one placement, NO_CANDIDATES when
    no running attempt is eligible at all."""
    candidates = [
        a
        for a in state.running.values()
        if a.preempting_deadline is None and plugin.eligible(job, a, state, now)
    ]
    if not candidates:
        return NO_CANDIDATES
    candidates.sort(key=lambda a: plugin.order_key(a, state, now))
    allowed = set(req.classes)
    on_node: dict[int, list[RunningAttempt]] = {}
    for a in candidates:
        for node, _ in a.placement:
            if state.node_class[node] in allowed and state.is_schedulable(node):
                lst = on_node.setdefault(node, [])
                if not lst or lst[-1] is not a:
                    lst.append(a)
    rank = {id(a): i for i, a in enumerate(candidates)}
    nodes = _choose_nodes(state, req, on_node, rank)
    if nodes is None:
        return None
    needed: dict[int, RunningAttempt] = {}
    for node, gpus in nodes:
        have = state.index.avail[node]
        for a in on_node.get(node, ()):
            if have >= gpus:
                break
            if id(a) not in needed:
                needed[id(a)] = a
            have += sum(m.bit_count() for n, m in a.placement if n == node)
    return _confirm(state, req, job, list(needed.values()))


def _choose_nodes(
    state: ClusterState, req: Request, on_node: dict[int, list[RunningAttempt]], rank: dict[int, int]
) -> list[tuple[int, int]] | None:
    """(node, GPUs wanted there) for the cheapest domain at the tightest feasible span."""
    g = max(1, req.gpus_per_replica)
    potential: dict[int, int] = {}
    for node, victims in on_node.items():
        gpus = state.index.avail[node] + sum(
            m.bit_count() for v in victims for n, m in v.placement if n == node
        )
        if gpus >= g:
            potential[node] = gpus
    free_nodes = [n for n in state.index.nodes_by_avail(0, req.classes, g, True) if n not in potential]
    free_slots = sum(state.index.avail[n] // g for n in free_nodes)
    if sum(p // g for p in potential.values()) + free_slots < req.replicas:
        return None
    for node in free_nodes:
        potential[node] = state.index.avail[node]
    topo = state.topology
    last = len(topo.span_names) - 1

    def cost(node: int, gpus: int) -> tuple[int, int]:
        have = state.index.avail[node]
        worst = -1
        for v in on_node.get(node, ()):
            if have >= gpus:
                break
            worst = max(worst, rank[id(v)])
            have += sum(m.bit_count() for n, m in v.placement if n == node)
        return (worst, len(on_node.get(node, ())))

    per_replica = req.gpus_per_replica
    if req.per_node:
        per_replica = g
    spans = [1] if req.replicas * per_replica <= max(potential.values(), default=0) else []
    spans += list(range(2, min(req.max_span, last) + 1))
    for span in spans:
        depth = 0 if span in (1, last) else topo.depth_of_span(span)
        best: tuple[tuple[int, int], list[tuple[int, int]]] | None = None
        for dom in topo.by_depth[depth]:
            members = [n for n in topo.domains[dom].nodes if n in potential]
            if span == 1:
                members = [n for n in members if potential[n] >= req.gpus]
                if not members:
                    continue
                node = min(members, key=lambda n: (cost(n, req.gpus), potential[n]))
                choice = (cost(node, req.gpus), [(node, req.gpus)])
            else:
                picked = _pick_in_domain(members, potential, req, per_replica, cost)
                if picked is None:
                    continue
                choice = picked
            if best is None or choice[0] < best[0]:
                best = choice
        if best is not None:
            return best[1]
    return None


def _pick_in_domain(
    members: list[int],
    potential: dict[int, int],
    req: Request,
    per_replica: int,
    cost: Callable[[int, int], tuple[int, int]],
) -> tuple[tuple[int, int], list[tuple[int, int]]] | None:
    slots = {n: (1 if req.per_node else potential[n] // per_replica) for n in members}
    if sum(slots.values()) < req.replicas:
        return None
    order = sorted(members, key=lambda n: (cost(n, slots[n] * per_replica), -slots[n]))
    left, chosen, worst = req.replicas, [], (-1, 0)
    for n in order:
        take = min(left, slots[n])
        if take <= 0:
            continue
        c = cost(n, take * per_replica)
        worst = max(worst, c)
        chosen.append((n, take * per_replica))
        left -= take
        if left == 0:
            break
    return (worst[0], len(chosen)), chosen


def _confirm(
    state: ClusterState, req: Request, job: PendingJob, victims: list[RunningAttempt]
) -> Selection | None:
    """Release the victims tentatively, place the job, keep only victims the placement touches."""
    checkpoint = state.plan.checkpoint()
    for a in victims:
        for node, mask, cpus, memory in state.attempt_resources(a):
            state.give_back(node, mask, cpus, memory, a.exclusive)
    placed = place(state, req, job.avoid_nodes)
    state.plan.rollback(checkpoint)
    if not isinstance(placed, list):
        return None
    used: dict[int, int] = {}
    for node, mask in placed:
        used[node] = used.get(node, 0) | mask
    kept = [a for a in victims if any(used.get(n, 0) & m for n, m in a.placement)]
    return Selection(placed, kept)
