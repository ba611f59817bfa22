"""Domain-first gang placement: the tightest span that holds the whole gang, then best fit.

A gang is placed as a whole or not at all: the tightest span that can hold it is chosen first
(one NVLink domain, one node, then the cluster file's levels from the innermost out, then the
cluster); among the domains of that span, the one that needs the fewest nodes and leaves the
least capacity unused; inside it, nodes best fit first. GPUs inside a node come from the NVLink
group that fits most tightly. Allocation goes through the plan, so a caller can roll it back.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.model import Placement, ReplicaPlacement
from corral.core.state import ClusterState

NodeMask = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Request:
    """What a gang needs, resolved against the node classes (cached per job shape)."""

    replicas: int
    gpus_per_replica: int
    classes: tuple[int, ...]
    max_span: int  # loosest span allowed (a required pack), else the cluster
    per_node: bool
    cpus: int
    memory: float
    single_group: tuple[int, ...] = ()  # classes whose nodes are one NVLink domain
    multi_group: tuple[int, ...] = ()  # classes with several NVLink domains, one large enough for the gang

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    def __hash__(self) -> int:
        """The hash dataclasses would give (the fields' tuple), written out so that the compiled
        core computes it natively: requests key the reservation searches' memories."""
        return hash(
            (
                self.replicas,
                self.gpus_per_replica,
                self.classes,
                self.max_span,
                self.per_node,
                self.cpus,
                self.memory,
                self.single_group,
                self.multi_group,
            )
        )


class Miss:
    """Why a gang did not fit now: the most replicas any allowed domain could hold. (A class
    written out, not a dataclass with slots: the compiled core builds it natively.)"""

    __slots__ = ("best_gpus", "best_replicas", "span")

    def __init__(self, span: int, best_replicas: int, best_gpus: int) -> None:
        self.span = span
        self.best_replicas = best_replicas
        self.best_gpus = best_gpus

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Miss):
            return NotImplemented
        return (
            self.span == other.span
            and self.best_replicas == other.best_replicas
            and self.best_gpus == other.best_gpus
        )

    __hash__ = None  # type: ignore[assignment]  # (mutable: as the dataclass was)

    def __repr__(self) -> str:
        return f"Miss(span={self.span}, best_replicas={self.best_replicas}, best_gpus={self.best_gpus})"


def place(
    state: ClusterState,
    req: Request,
    avoid: frozenset[int] = frozenset(),
    explain: bool = True,
    take: bool = True,
) -> list[NodeMask] | Miss:
    """Allocate the gang through the plan and return (node, GPU mask) per replica, or a Miss.

    With `explain` off, a Miss carries no counts (computing them queries every domain). With
    `take` off, nothing is allocated: the answer is the one placing and rolling back gives (the
    nodes are chosen before any is taken, and each node's GPUs are picked from its own free mask).
    """
    if req.gpus_per_replica == 0 or req.per_node:
        return _place_scan(state, req, avoid, take)
    index = state.index
    classes = req.classes
    g, total = req.gpus_per_replica, req.gpus
    # a node found here holds the whole gang, so the cluster's capacity holds it too: the
    # capacity (a walk over buckets) is needed only when no single NVLink group fits
    node = _nvlink_fit(state, req)
    if node >= 0 and (not (req.cpus or req.memory) or _node_fits(state, req, node) >= req.replicas):
        return _take(state, req, [(node, req.replicas)], take)
    root_cap, root_free = index.capacity(0, classes, g)
    n_spans = len(state.topology.span_names)
    if root_cap < req.replicas:
        return Miss(n_spans - 1, root_cap, root_free)
    if req.max_span == 0:
        return Miss(0, 0, 0)
    node = index.best_fit(0, classes, total)
    if node >= 0 and node not in avoid:
        if req.cpus or req.memory:  # the index counts GPUs only: the smallest node holding all of it
            node = _smallest_holding(state, req, 0, req.replicas, set(avoid))
        if node >= 0:
            return _take(state, req, [(node, req.replicas)], take)
    topo = state.topology
    for span in range(2, min(req.max_span, n_spans - 1) + 1):
        depth = topo.depth_of_span(span)
        best: tuple[int, int, int] | None = None
        for dom in topo.by_depth[depth]:
            cap, free = index.capacity(dom, classes, g)
            if cap < req.replicas:
                continue
            key = (index.nodes_needed(dom, classes, g, req.replicas), free - total, dom)
            if best is None or key < best:
                best = key
        if best is not None:
            placed = _fill(state, req, best[2], avoid, take)
            if placed is not None:
                return placed
    if req.max_span < n_spans - 1:
        return Miss(req.max_span, *(_best_in_span(state, req, req.max_span) if explain else (0, 0)))
    placed = _fill(state, req, 0, avoid, take)
    return placed if placed is not None else Miss(n_spans - 1, root_cap, root_free)


def sure_miss(state: ClusterState, req: Request) -> Miss | None:
    """The Miss that `place` returns now, when it can tell without trying a domain (so without
    touching the index); None when it would place the gang, or would have to try to know."""
    if req.gpus_per_replica == 0 or req.per_node or _nvlink_fit(state, req) >= 0:
        return None
    root_cap, root_free = state.index.capacity(0, req.classes, req.gpus_per_replica)
    n_spans = len(state.topology.span_names)
    if root_cap < req.replicas:
        return Miss(n_spans - 1, root_cap, root_free)
    if req.max_span == 0:
        return Miss(0, 0, 0)
    if req.max_span >= n_spans - 1 or state.index.best_fit(0, req.classes, req.gpus) >= 0:
        return None
    topo, g = state.topology, req.gpus_per_replica
    for span in range(2, req.max_span + 1):
        if any(
            state.index.capacity(d, req.classes, g)[0] >= req.replicas
            for d in topo.by_depth[topo.depth_of_span(span)]
        ):
            return None  # `place` would try to fill that domain
    return Miss(req.max_span, *_best_in_span(state, req, req.max_span))


def _nvlink_fit(state: ClusterState, req: Request) -> int:
    """The node whose best NVLink group fits the whole gang most tightly; -1 when none."""
    total = req.gpus
    single, multi = req.single_group, req.multi_group
    node = state.index.best_fit(0, single, total) if single else -1
    if multi:
        other = state.nvl_index.best_fit(0, multi, total)
        if other >= 0 and (node < 0 or state.nvl_index.avail[other] < state.index.avail[node]):
            node = other
    return node


def _best_in_span(state: ClusterState, req: Request, span: int) -> tuple[int, int]:
    if span <= 1:
        return 0, 0
    depth = state.topology.depth_of_span(span)
    return max(
        (state.index.capacity(d, req.classes, req.gpus_per_replica) for d in state.topology.by_depth[depth]),
        default=(0, 0),
    )


def _fill(
    state: ClusterState, req: Request, domain: int, avoid: frozenset[int], take: bool = True
) -> list[NodeMask] | None:
    """Fill one domain node by node: the smallest node holding the rest, else the largest node."""
    left = req.replicas
    chosen: list[tuple[int, int]] = []
    skip = set(avoid)
    checkpoint = state.plan.checkpoint()
    while left:
        node = _smallest_holding(state, req, domain, left, skip)
        if node >= 0:
            chosen.append((node, left))
            break
        node, fit = _largest(state, req, domain, skip)
        if node < 0:
            state.plan.rollback(checkpoint)
            return None
        chosen.append((node, fit))
        skip.add(node)
        left -= fit
    return _take(state, req, chosen, take)


def _node_fits(state: ClusterState, req: Request, node: int) -> int:
    """How many replicas of the gang a node can take now (GPUs, CPUs and memory)."""
    fit = state.index.avail[node] // req.gpus_per_replica
    if req.cpus:
        fit = min(fit, state.free_cpus[node] // req.cpus)
    if req.memory:
        fit = min(fit, int(state.free_memory[node] // req.memory))
    return fit


def _smallest_holding(state: ClusterState, req: Request, domain: int, reps: int, skip: set[int]) -> int:
    need = reps * req.gpus_per_replica
    per_class = state.index.buckets[domain]
    best, best_k = -1, 1 << 30
    for cls in req.classes:
        bl = per_class.get(cls)
        if bl is None:
            continue
        for k in range(need, min(len(bl), best_k)):
            found = next((n for n in bl[k] if n not in skip and _node_fits(state, req, n) >= reps), -1)
            if found >= 0:
                best, best_k = found, k
                break
    return best


def _largest(state: ClusterState, req: Request, domain: int, skip: set[int]) -> tuple[int, int]:
    per_class = state.index.buckets[domain]
    best, best_fit = -1, 0
    for cls in req.classes:
        bl = per_class.get(cls)
        if bl is None:
            continue
        for k in range(len(bl) - 1, req.gpus_per_replica - 1, -1):
            if k // req.gpus_per_replica <= best_fit:
                break
            for n in bl[k]:
                if n in skip:
                    continue
                fit = _node_fits(state, req, n)
                if fit > best_fit:
                    best, best_fit = n, fit
                    break
    return best, best_fit


def _take(
    state: ClusterState, req: Request, chosen: list[tuple[int, int]], take: bool = True
) -> list[NodeMask]:
    """Pick GPUs inside each chosen node and allocate them (unless `take` is off); one entry per
    replica, rank order."""
    result: list[NodeMask] = []
    g = req.gpus_per_replica
    for node, reps in chosen:
        free = state.free_mask(node)
        groups = state.group_masks[node]
        if len(groups) > 1 and any((free & m).bit_count() >= reps * g for m in groups):
            free = pick_gpus(free, groups, reps * g)  # the node's share fits one group: keep it there
        for _ in range(reps):
            mask = pick_gpus(free, groups, g)
            free &= ~mask
            result.append((node, mask))
            if take:
                state.take(node, mask, req.cpus, req.memory, req.per_node)
    return result


def pick_gpus(free: int, groups: tuple[int, ...], count: int) -> int:
    """`count` GPUs from `free`: inside the tightest NVLink group that holds them, else fewest groups."""
    if len(groups) == 1:
        return _lowest_bits(free, count)
    best_group, best_free = 0, 1 << 30
    for group in groups:
        n = (free & group).bit_count()
        if count <= n < best_free:
            best_group, best_free = group, n
    if best_group:
        return _lowest_bits(free & best_group, count)
    mask = 0
    for group in sorted(groups, key=lambda gm: -(free & gm).bit_count()):
        take = min(count - mask.bit_count(), (free & group).bit_count())
        mask |= _lowest_bits(free & group, take)
        if mask.bit_count() == count:
            break
    return mask


def _lowest_bits(bits: int, count: int) -> int:
    if count == 1:
        return bits & -bits
    mask = 0
    while count > 0 and bits:
        low = bits & -bits
        mask |= low
        bits ^= low
        count -= 1
    return mask


def _place_scan(
    state: ClusterState, req: Request, avoid: frozenset[int], take: bool = True
) -> list[NodeMask] | Miss:
    """Node-exclusive (per_node) and GPU-less gangs: scan schedulable idle nodes, domain first."""
    topo = state.topology
    g = req.gpus_per_replica
    allowed = set(req.classes)

    def usable(n: int) -> bool:
        if n in avoid or state.node_class[n] not in allowed or not state.is_schedulable(n):
            return False
        if req.per_node and (state.alloc[n] or state.held[n]):
            return False
        return state.index.avail[n] >= g and _node_fits_scan(state, req, n)

    last = len(topo.span_names) - 1
    spans = [1] if req.replicas == 1 else list(range(2, min(req.max_span, last) + 1))
    most = 0
    for span in spans:
        depth = 0 if span in (1, last) else topo.depth_of_span(span)
        best: list[int] | None = None
        for dom in topo.by_depth[depth]:
            nodes = [n for n in topo.domains[dom].nodes if usable(n)]
            most = max(most, len(nodes))
            if len(nodes) >= req.replicas and (best is None or len(nodes) < len(best)):
                best = nodes
        if best is not None:
            best.sort(key=lambda n: state.index.avail[n])
            return _take(state, req, [(n, 1) for n in best[: req.replicas]], take)
    return Miss(req.max_span, most, most * g)


def _node_fits_scan(state: ClusterState, req: Request, node: int) -> bool:
    return (not req.cpus or state.free_cpus[node] >= req.cpus) and (
        not req.memory or state.free_memory[node] >= req.memory
    )


_INDICES: dict[int, tuple[int, ...]] = {}


def gpu_indices(mask: int) -> tuple[int, ...]:
    """The GPU indices of a mask, lowest first (memoised: masks repeat)."""
    found = _INDICES.get(mask)
    if found is None:
        found = tuple(i for i in range(mask.bit_length()) if mask >> i & 1)
        if len(_INDICES) < 65536:
            _INDICES[mask] = found
    return found


def to_placement(state: ClusterState, placed: list[NodeMask]) -> Placement:
    """Node ids and masks to node names and GPU indices, one entry per replica."""
    specs = state.specs
    return tuple(ReplicaPlacement(specs[n].name, gpu_indices(mask)) for n, mask in placed)
