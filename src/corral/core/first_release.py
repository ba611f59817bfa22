"""The first release after which a blocked gang may fit by count: where the reservation search
(`reserve`) starts placing.

Running attempts are released in order of expected end, counted outside the state (the
available GPUs per node as `NodeTable` counts them, and the replicas per domain the gang may
use); nothing fits before the first release after which some such domain has replicas enough.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.counted import ReleaseCounts
from corral.core.model import JobId, NodeState
from corral.core.placement import Request
from corral.core.state import ClusterState


def first_possible(
    state: ClusterState, req: Request, ends: Sequence[tuple[float, int, JobId]], collect: bool = True
) -> tuple[
    int | None, frozenset[int] | None, list[tuple[int, int, int, float, bool]] | None, ReleaseCounts | None
]:
    """The first release after which some domain the gang may use has GPUs enough for it, by
    count (an upper bound of what placement finds: NVLink groups, CPUs and memory aside), the
    nodes of the domains that reached it then (None: the whole cluster, or already before any
    release), and what the releases up to it give back (`_releases`; None when nothing was
    released, or `collect` off) and the counts then (`counted.ReleaseCounts`; None when nothing was
    released); (None, None, None, None) when no domain ever does. Counts nodes' available GPUs
    as the index does (`NodeTable.available`, inlined), without the plan."""
    topo, index = state.topology, state.index
    g, classes = req.gpus_per_replica, req.classes
    allowed = set(classes)
    last = len(topo.span_names) - 1
    depth = -1 if req.max_span <= 1 else (topo.depth_of_span(req.max_span) if req.max_span < last else 0)
    if depth < 0:
        if index.best_fit(0, classes, req.gpus) >= 0:
            return 0, None, None, None  # a node has GPUs enough already (placement failed otherwise)
    elif any(index.capacity(dom, classes, g)[0] >= req.replicas for dom in topo.by_depth[depth]):
        return 0, None, None, None  # the same for a domain
    counts: dict[int, int] = {}  # domain at `depth` -> replicas its nodes hold, once touched
    alloc: dict[int, int] = {}  # node -> allocated mask after the releases so far, once touched
    avail: dict[int, int] = {}  # node -> its available GPUs then
    freed_exclusive: set[int] = set()
    releases: list[tuple[int, int, int, float, bool]] = []
    running, node_class, up = state.running, state.node_class, NodeState.UP
    node_state, healthy, held, reserved = state.node_state, state.healthy, state.held, state.reserved
    state_alloc, state_exclusive, index_avail = state.alloc, state.exclusive, index.avail
    node_domains, replicas, gpus = topo.node_domains, req.replicas, req.gpus
    root = index.capacity(0, classes, g)[0] if depth == 0 else 0  # the cluster's count (depth 0)
    for i, (_, _, job_id) in enumerate(ends):
        attempt = running[job_id]
        exclusive = attempt.exclusive
        if collect:
            spec = attempt.spec
            cpus, memory = spec.cpus_per_replica, spec.memory_gib_per_replica
            for node, mask in attempt.placement:
                releases.append((node, mask, cpus, memory, exclusive))
        reached: list[int] | None = None
        for node, mask in attempt.placement:
            if node_class[node] not in allowed:
                continue
            before = alloc.get(node)
            left = (state_alloc[node] if before is None else before) & ~mask
            alloc[node] = left
            if exclusive:
                freed_exclusive.add(node)
            if node_state[node] is not up or (state_exclusive[node] and node not in freed_exclusive):
                new = 0
            else:
                new = max(0, (healthy[node] & ~left & ~held[node]).bit_count() - reserved[node])
            was = avail.get(node)
            old = index_avail[node] if was is None else was
            avail[node] = new
            if depth == 0:
                root += new // g - old // g
                if root >= replicas:
                    reached = [0]
                continue
            if depth < 0:
                if new >= gpus:
                    reached = [node] if reached is None else [*reached, node]
                continue
            dom = node_domains[node][depth]
            count = counts.get(dom)
            if count is None:
                count = index.capacity(dom, classes, g)[0]
            count += new // g - old // g
            counts[dom] = count
            if count >= replicas:
                reached = [dom] if reached is None else [*reached, dom]
        if reached is not None:
            counted = ReleaseCounts(state, classes, alloc, avail, freed_exclusive)
            out = releases if collect else None
            if depth == 0:
                return i, None, out, counted
            if depth < 0:
                return i, frozenset(reached), out, counted
            return i, frozenset(n for dom in reached for n in topo.domains[dom].nodes), out, counted
    return None, None, None, None
