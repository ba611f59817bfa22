"""Which nodes a victim search frees (`preempt`): the cheapest domain at the tightest span that
the nodes' *potentials* (available GPUs plus what their candidate victims hold) allow.

Spans are tried from the tightest (one node, when one node's potential holds the whole job) up to
the request's widest; in each, every domain of that depth offers its cheapest set: for one node,
the node cheapest to free that holds the job (then the one with the least potential); for more,
the nodes by cost of freeing as many whole replicas as each can hold (then by most replicas),
taken in that order until the gang's replicas are covered. A set's cost is the highest class it
takes, then the lost GPU-seconds summed, then its node count; the first span with any set wins.
The costs come from the caller (`preempt._by_aggregates` bounds them from per-node aggregates,
`preempt._full_scan` reads the attempts), remembered per (node, GPUs) for one call.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.core.placement import Request
from corral.core.state import ClusterState

Cost = tuple[int, float]  # (highest class taken, lost GPU-seconds)
FREE: Cost = (-(1 << 62), 0.0)  # the cost of GPUs that are free already


def choose_nodes(
    state: ClusterState, req: Request, potential: dict[int, int], cost: Callable[[int, int], Cost]
) -> list[tuple[int, int]] | None:
    """(node, GPUs wanted there) for the cheapest domain at the tightest feasible span."""
    per_replica = max(1, req.gpus_per_replica)
    if sum(1 if req.per_node else p // per_replica for p in potential.values()) < req.replicas:
        return None
    topo = state.topology
    last = len(topo.span_names) - 1
    memo: dict[tuple[int, int], Cost] = {}

    def cached(node: int, gpus: int) -> Cost:
        key = (node, gpus)
        found = memo.get(key)
        if found is None:
            found = memo[key] = cost(node, gpus)
        return found

    spans = [1] if req.gpus <= max(potential.values(), default=0) and not req.per_node else []
    spans += list(range(2, min(req.max_span, last) + 1))
    for span in spans:
        depth = 0 if span in (1, last) else topo.depth_of_span(span)
        best: tuple[tuple[int, float, int], list[tuple[int, int]]] | None = None
        for dom in topo.by_depth[depth]:
            members = [n for n in topo.domains[dom].nodes if n in potential]
            if span == 1:
                # the node cheapest to free, then with the least potential (the first such node)
                need, top = req.gpus, None
                for n in members:
                    have = potential[n]
                    if have >= need:
                        key = (cached(n, need), have)
                        if top is None or key < top[0]:
                            top = (key, n)
                if top is None:
                    continue
                (worst, lost), _ = top[0]
                choice = ((worst, lost, 1), [(top[1], need)])
            else:
                picked = _pick_in_domain(members, potential, req, per_replica, cached)
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
    cost: Callable[[int, int], Cost],
) -> tuple[tuple[int, float, int], list[tuple[int, int]]] | None:
    slots = {n: (1 if req.per_node else potential[n] // per_replica) for n in members}
    if sum(slots.values()) < req.replicas:
        return None
    order = sorted(members, key=lambda n: (cost(n, slots[n] * per_replica), -slots[n]))
    left, chosen, worst, lost = req.replicas, [], FREE[0], 0.0
    for n in order:
        take = min(left, slots[n])
        if take <= 0:
            continue
        c = cost(n, take * per_replica)
        worst, lost = max(worst, c[0]), lost + c[1]
        chosen.append((n, take * per_replica))
        left -= take
        if left == 0:
            break
    return (worst, lost, len(chosen)), chosen
