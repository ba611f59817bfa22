"""The first release after which a blocked gang may fit by count: where the reservation search
(`reserve`) starts placing.

Running attempts are released in order of expected end, counted outside the state (the
available GPUs per node as `NodeTable` counts them, and the replicas per domain the gang may
use); nothing fits before the first release after which some such domain has replicas enough
(`first_possible`; the counts then, `ReleaseCounts`, go on release by release and can be
undone). A gang of whole nodes (replicas of all a node's GPUs) that may spread over the cluster
gains a replica only where a node is wholly released: `WholeNodes` reads the nodes in the order
of their last attempts' ends (`AttemptTable.last_ends`) instead of walking the attempts
(`tests/core/test_whole_nodes.py` compares the two).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from corral.core.counted import NeedsAll
from corral.core.model import INFINITY, JobId, NodeState
from corral.core.placement import Request
from corral.core.state import ClusterState


class ReleaseCounts:
    """The available GPUs of the nodes of some classes as running attempts are released in turn,
    counted outside the state as `NodeTable._refresh` would (`avail`: the nodes touched so far);
    the last releases can be undone (the reservation search's binary search goes back)."""

    __slots__ = ("_log", "alloc", "allowed", "avail", "freed", "state")

    def __init__(
        self,
        state: ClusterState,
        classes: tuple[int, ...],
        alloc: dict[int, int] | None = None,
        avail: dict[int, int] | None = None,
        freed: set[int] | None = None,
    ) -> None:
        self.state = state
        self.allowed = set(classes)
        self.alloc: dict[int, int] = {} if alloc is None else alloc  # node -> its allocated mask then
        self.avail: dict[int, int] = {} if avail is None else avail
        self.freed: set[int] = set() if freed is None else freed  # nodes an exclusive attempt left
        self._log: list[list[tuple[int, int, int, bool]]] = []  # per release: (node, alloc, avail, freed)

    def release(self, job_id: JobId) -> None:
        state = self.state
        attempt = state.running[job_id]
        exclusive = attempt.exclusive
        alloc, avail, freed, allowed = self.alloc, self.avail, self.freed, self.allowed
        node_class, node_state, up = state.node_class, state.node_state, NodeState.UP
        undo: list[tuple[int, int, int, bool]] = []
        for node, mask in attempt.placement:
            if node_class[node] not in allowed:
                continue
            before = alloc.get(node, -1)
            left = (state.alloc[node] if before < 0 else before) & ~mask
            alloc[node] = left
            newly = exclusive and node not in freed
            if newly:
                freed.add(node)
            undo.append((node, before, avail.get(node, -1), newly))
            if node_state[node] is not up or (state.exclusive[node] and node not in freed):
                avail[node] = 0
            else:
                free = state.healthy[node] & ~left & ~state.held[node]
                avail[node] = max(0, free.bit_count() - state.reserved[node])
        self._log.append(undo)

    def undo(self) -> None:
        """Undo the last `release`."""
        alloc, avail, freed = self.alloc, self.avail, self.freed
        for node, before, count, newly in reversed(self._log.pop()):
            if before < 0:
                del alloc[node]
            else:
                alloc[node] = before
            if count < 0:
                del avail[node]
            else:
                avail[node] = count
            if newly:
                freed.discard(node)

    @property
    def releases(self) -> int:
        """How many releases can be undone."""
        return len(self._log)


def first_possible(
    state: ClusterState, req: Request, ends: Sequence[tuple[float, int, JobId]], collect: bool = True
) -> tuple[
    int | None, frozenset[int] | None, list[tuple[int, int, int, float, bool]] | None, ReleaseCounts | None
]:
    """The first release after which some domain the gang may use has GPUs enough for it, by
    count (an upper bound of what placement finds: NVLink groups, CPUs and memory aside), the
    nodes of the domains that reached it then (None: the whole cluster, or already before any
    release), and what the releases up to it give back (`_releases`; None when nothing was
    released, or `collect` off) and the counts then (`ReleaseCounts`; None when nothing was
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


class WholeNodes:
    """For a countable gang whose replicas take all the GPUs of a node of any of its classes and
    that may spread over the cluster (`applies`): the first release after which the cluster has
    replicas enough (`first`), and the nodes at `g` GPUs or more after a release (`avail`), read
    from the nodes wholly released by then (every attempt that holds GPUs of the node, or the
    whole node, ended). A node not wholly released stays under `g`, and a wholly released node
    has what it would have after the walk of `first_possible` (its allocated GPUs are those of
    its attempts; a node with two whole-node attempts raises `NeedsAll`), so `first` is that
    walk's, and `avail` what `counted.place_counts(..., whole=True)` needs."""

    __slots__ = ("allowed", "counted", "ends", "g", "reached", "req", "state", "wholly")

    def __init__(self, state: ClusterState, req: Request, ends: Sequence[tuple[float, int, JobId]]) -> None:
        self.state, self.req, self.ends = state, req, ends  # (`ends`: the finite prefix of `by_end`)
        self.g = req.gpus_per_replica
        self.allowed = set(req.classes)
        self.wholly: dict[int, int] = {}  # node -> its available GPUs once wholly released
        # what `first` read (`fit_reads`): the nodes it counted, in order, and the end key at which
        # the cluster had replicas enough (None: not reached, or reached before any release)
        self.counted: list[int] = []
        self.reached: tuple[float, int, JobId] | None = None

    @staticmethod
    def applies(state: ClusterState, req: Request) -> bool:
        """Whether the gang is one of whole nodes that may spread over the cluster (countable)."""
        g, class_gpus = req.gpus_per_replica, state.index.class_gpus
        return (
            req.max_span > 1
            and req.max_span >= len(state.topology.span_names) - 1
            and all(class_gpus[cls] == g for cls in req.classes)
        )

    def _free(self, node: int) -> int:
        """The node's available GPUs once all its attempts are released (`wholly_free`)."""
        known = self.wholly.get(node)
        if known is not None:
            return known
        new = self.wholly[node] = wholly_free(self.state, node)
        return new

    def first(self) -> int | None:
        """`first_possible`'s first release for this gang; None if never."""
        state, g, allowed = self.state, self.g, self.allowed
        needed = self.req.replicas - state.index.capacity(0, self.req.classes, g)[0]
        if needed <= 0:
            return 0
        node_class, base, counted = state.node_class, state.index.avail, self.counted
        for end, seq, job_id, node in state.last_ends:
            if end >= INFINITY:
                return None  # (an attempt without an end: never released)
            if node_class[node] in allowed and base[node] < g and self._free(node) >= g:
                counted.append(node)
                needed -= 1
                if needed == 0:
                    key = self.reached = (end, seq, job_id)
                    return bisect_left(self.ends, key)
        return None

    def avail(self, last: int) -> dict[int, int]:
        """The nodes of the gang's classes at `g` GPUs or more after the releases up to `last`
        that changed (their available GPUs then)."""
        state, g, allowed = self.state, self.g, self.allowed
        node_class, base, key = state.node_class, state.index.avail, self.ends[last]
        out: dict[int, int] = {}
        for end, seq, job_id, node in state.last_ends:
            if (end, seq, job_id) > key:
                break
            if node_class[node] in allowed and base[node] < g:
                new = self._free(node)
                if new >= g:
                    out[node] = new
        return out


def wholly_free(state: ClusterState, node: int) -> int:
    """A node's available GPUs once all its attempts with a place in `AttemptTable.node_ends` are
    released (as `first_possible` counts them); `NeedsAll` if two of them hold it whole."""
    if state.node_state[node] is not NodeState.UP:
        return 0
    freed, exclusive = state.node_freed[node]
    if exclusive > 1:
        raise NeedsAll  # (the first of them to end frees the node: the walk decides)
    if not exclusive and state.exclusive[node]:
        return 0
    left = state.alloc[node] & ~freed
    free = state.healthy[node] & ~left & ~state.held[node]
    return max(0, free.bit_count() - state.reserved[node])
