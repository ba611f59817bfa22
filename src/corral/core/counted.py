"""Where a gang would place were some nodes' available GPUs different, decided on the counts
alone: the reservation search's tentative placements, without releasing anything in the state.

`place` (`core/placement.py`) decides a gang that asks for GPUs and no CPUs or memory, is not
node-exclusive and may use no class with several NVLink groups on the nodes' available counts
alone: `_nvlink_fit` is a best fit over single-group classes, the domains are chosen by their
capacities and `nodes_needed`, `_fill` takes nodes from the free-count buckets (sorted by node
id) and a node holds `avail // g` replicas; the GPUs inside a node do not change which nodes or
how many GPUs on each. `place_counts` answers as `place(explain=False, take=False)` would on the
state where the nodes of `avail` have those counts, as (node, GPUs) sorted by node: the
buckets are read with the changed nodes moved (a bucket's order is a function of the counts
alone, `core/index.py`), and nothing is written (`tests/core/test_counted.py` compares it with
releasing and placing). Its cost follows what can hold a replica, not the cluster's size: of the
changed nodes only those from or to `g` GPUs or more are read up front, a span's domains are
compared only where such a node is (unless such nodes outnumber the domains), a domain's free
GPUs are counted only once it can hold the gang, and a fill never rescans the nodes it took.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.core.index import Bucket
from corral.core.placement import Request
from corral.core.state import ClusterState


def countable(req: Request) -> bool:
    """Whether `place` decides this gang on nodes' available GPU counts alone."""
    return (
        req.gpus_per_replica > 0
        and not req.per_node
        and not req.cpus
        and not req.memory
        and not req.multi_group
    )


def bucket_replicas(per_class: dict[int, list[Bucket]], classes: tuple[int, ...], g: int) -> int:
    """Replicas of `g` GPUs that one domain's free buckets hold for the request's classes (a node
    in bucket `k` holds `k // g` of them)."""
    replicas = 0
    for cls in classes:
        bl = per_class.get(cls)
        if bl is None:
            continue
        for k in range(g, len(bl)):
            count = len(bl[k])
            if count:
                replicas += count * (k // g)
    return replicas


def replicas_with(state: ClusterState, req: Request, avail: dict[int, int]) -> int:
    """Replicas of `g` GPUs that the request's classes hold in the whole cluster were the nodes of
    `avail` at those counts: what `place_counts` counts first (`_View.replicas` of the root),
    without building its view. Fewer than the gang's replicas: `place_counts` answers None."""
    g, classes, base, node_class = req.gpus_per_replica, req.classes, state.index.avail, state.node_class
    replicas = bucket_replicas(state.index.buckets[0], classes, g)
    for node, new in avail.items():
        old = base[node]
        if new != old and (new >= g or old >= g) and node_class[node] in classes:
            replicas += new // g - old // g
    return replicas


class NeedsAll(Exception):
    """`place_counts(..., whole=True)` cannot tell: domains are compared by their free GPUs."""


def place_counts(
    state: ClusterState, req: Request, avail: dict[int, int], whole: bool = False
) -> list[tuple[int, int]] | None:
    """(node, GPUs) where `place` puts a countable gang were the nodes of `avail` (of the
    request's classes; others are read from the index) at those available counts; None if
    nowhere. `whole`: `avail` holds only the changed nodes at `g` GPUs or more (the others
    changed too, but stay under `g`): the answer depends on them only where two domains that
    hold the gang are compared (by their free GPUs), and `NeedsAll` is raised then."""
    view = _View(state, req, avail)
    reps, classes = req.replicas, req.classes
    node = view.best_fit(0, req.single_group, req.gpus) if req.single_group else -1
    if node >= 0:
        return [(node, req.gpus)]
    if view.replicas(0, classes) < reps:
        return None
    if req.max_span == 0:
        return None
    node = view.best_fit(0, classes, req.gpus)
    if node >= 0:
        return [(node, req.gpus)]
    topo = state.topology
    n_spans = len(topo.span_names)
    for span in range(2, min(req.max_span, n_spans - 1) + 1):
        depth = topo.depth_of_span(span)
        doms = view.candidates(topo.by_depth[depth], depth, classes, reps)
        holding = [dom for dom in doms if view.replicas(dom, classes) >= reps]
        if len(holding) > 1:  # (the best key; one domain is taken without its key)
            if whole:
                raise NeedsAll
            best = min(
                (view.nodes_needed(dom, classes, reps), view.free(dom, depth, classes) - req.gpus, dom)
                for dom in holding
            )
            holding = [best[2]]
        if holding:
            placed = view.fill(holding[0], req)
            if placed is not None:
                return placed
    if req.max_span < n_spans - 1:
        return None
    return view.fill(0, req)


class _View:
    """The free-count index as it would be with the nodes of `avail` at those counts, for one
    request. Every bucket the view reads holds `g` GPUs or more (a replica): read are the nodes
    that moved to such a count, by (class, count), the changes from or to such counts, each
    domain's change of replicas, and, when asked, of GPUs and of nodes per count (each computed
    once per view). A node of a bucket has moved when `avail` holds another count for it."""

    __slots__ = (
        "avail",
        "base",
        "big",
        "buckets",
        "classes",
        "free_at",
        "g",
        "into",
        "node_class",
        "node_domains",
        "per_k",
        "reps",
    )

    def __init__(self, state: ClusterState, req: Request, avail: dict[int, int]) -> None:
        self.base = base = state.index.avail
        self.buckets = state.index.buckets
        self.node_class = node_class = state.node_class
        self.node_domains = node_domains = state.topology.node_domains
        self.classes = classes = set(req.classes)
        g = req.gpus_per_replica
        into: dict[tuple[int, int], list[int]] = {}  # (class, count >= g) -> nodes moved there, by id
        reps: dict[int, int] = {}  # domain -> change of replicas
        big: list[tuple[int, int, int]] = []  # (node, old, new): the changes from or to `g` or more
        for node, new in avail.items():
            old = base[node]
            if (new < g and old < g) or new == old or node_class[node] not in classes:
                continue  # (`place` reads the nodes of the request's classes only)
            if new >= g:
                into.setdefault((node_class[node], new), []).append(node)
            big.append((node, old, new))
            change = new // g - old // g
            if change:
                for dom in node_domains[node]:
                    reps[dom] = reps.get(dom, 0) + change
        for nodes in into.values():
            nodes.sort()
        self.avail, self.into, self.reps, self.big, self.g = avail, into, reps, big, g
        self.free_at: dict[int, dict[int, int]] = {}  # depth -> domain -> change of GPUs
        self.per_k: dict[int, dict[int, int]] | None = None  # domain -> count -> change of nodes

    def _per_k(self) -> dict[int, dict[int, int]]:
        """For each domain, the change of its number of nodes per count (counts of `g` or more)."""
        if self.per_k is None:
            g = self.g
            per_k: dict[int, dict[int, int]] = {}
            for node, old, new in self.big:
                for dom in self.node_domains[node]:
                    ks = per_k.get(dom)
                    if ks is None:
                        ks = per_k[dom] = {}
                    if old >= g:
                        ks[old] = ks.get(old, 0) - 1
                    if new >= g:
                        ks[new] = ks.get(new, 0) + 1
            self.per_k = per_k
        return self.per_k

    def first(
        self,
        dom: int,
        cls: int,
        k: int,
        skip: set[int],
        pos: dict[tuple[int, int], tuple[int, int]] | None = None,
    ) -> int:
        """The lowest node id of bucket `k` (`g` or more) of class `cls` in `dom` not in `skip`;
        -1 if none. `pos` (one `fill`: the same domain, `skip` only grows) keeps where each
        bucket's search stopped: the nodes before it are out for good."""
        avail, node_domains = self.avail, self.node_domains
        bucket, moved_to = self.buckets[dom][cls][k], self.into.get((cls, k), ())
        i = j = 0
        if pos is not None:
            i, j = pos.get((cls, k), (0, 0))
        best, n = -1, len(bucket)
        while i < n:
            node = bucket[i]
            if avail.get(node, k) == k and node not in skip:
                best = node
                break
            i += 1
        found, m = -1, len(moved_to)
        while j < m:
            node = moved_to[j]
            if best >= 0 and node > best:
                break
            if node not in skip and dom in node_domains[node]:
                found = node
                break
            j += 1
        if pos is not None:
            pos[cls, k] = (i, j)
        return found if found >= 0 else best

    def best_fit(self, dom: int, classes: tuple[int, ...], need: int) -> int:
        """`FreeIndex.best_fit` (for a need of `g` GPUs or more)."""
        best, best_k = -1, 1 << 30
        per_class = self.buckets[dom]
        none: set[int] = set()
        for cls in classes:
            bl = per_class.get(cls)
            if bl is None:
                continue
            for k in range(need, min(len(bl), best_k)):
                node = self.first(dom, cls, k, none)
                if node >= 0:
                    best, best_k = node, k
                    break
        return best

    def replicas(self, dom: int, classes: tuple[int, ...]) -> int:
        """`FreeIndex.capacity(...)[0]` (replicas of `g` GPUs)."""
        return bucket_replicas(self.buckets[dom], classes, self.g) + self.reps.get(dom, 0)

    def free(self, dom: int, depth: int, classes: tuple[int, ...]) -> int:
        """`FreeIndex.capacity(...)[1]` (available GPUs) of a domain at `depth`."""
        total = 0
        per_class = self.buckets[dom]
        for cls in classes:
            bl = per_class.get(cls)
            if bl is None:
                continue
            for k in range(1, len(bl)):
                count = len(bl[k])
                if count:
                    total += count * k
        at = self.free_at.get(depth)
        if at is None:
            at = self.free_at[depth] = {}
            base, node_class, node_domains, allowed = (
                self.base,
                self.node_class,
                self.node_domains,
                self.classes,
            )
            for node, new in self.avail.items():
                old = base[node]
                if new != old and node_class[node] in allowed:
                    d = node_domains[node][depth]
                    at[d] = at.get(d, 0) + new - old
        return total + at.get(dom, 0)

    def candidates(
        self, domains: list[int], depth: int, classes: tuple[int, ...], reps: int
    ) -> Iterable[int]:
        """Of `domains` (those at `depth`), the ones that may hold `reps` (1 or more) replicas:
        those with a node of `g` GPUs or more; all of them when such nodes are no fewer than the
        domains (the order does not matter: the domains' keys in `place_counts` differ)."""
        if reps < 1:
            return domains
        g, roots, into = self.g, self.buckets[0], self.into
        nodes = 0  # nodes of `g` GPUs or more (the moved ones counted from and to)
        for cls in classes:
            bl = roots.get(cls)
            if bl is not None:
                for k in range(g, len(bl)):
                    nodes += len(bl[k])
        for moved_to in into.values():
            nodes += len(moved_to)
        if nodes >= len(domains):
            return domains
        found: set[int] = set()  # (with the domains of nodes that moved from such counts: no harm)
        node_domains = self.node_domains
        for cls in classes:
            bl = roots.get(cls)
            if bl is not None:
                for k in range(g, len(bl)):
                    for node in bl[k]:
                        found.add(node_domains[node][depth])
        for moved_to in into.values():
            for node in moved_to:
                found.add(node_domains[node][depth])
        return found

    def nodes_needed(self, dom: int, classes: tuple[int, ...], replicas: int) -> int:
        """`FreeIndex.nodes_needed` (for the request's classes and GPUs per replica)."""
        g = self.g
        per_k: dict[int, int] = {}
        per_class = self.buckets[dom]
        for cls in classes:
            bl = per_class.get(cls)
            if bl is None:
                continue
            for k in range(g, len(bl)):
                if bl[k]:
                    per_k[k] = per_k.get(k, 0) + len(bl[k])
        for k, change in self._per_k().get(dom, {}).items():
            per_k[k] = per_k.get(k, 0) + change
        left, nodes = replicas, 0
        for k in sorted(per_k, reverse=True):
            count = per_k[k]
            if not count:
                continue
            take = min(count, -(-left // (k // g)))
            nodes += take
            left -= take * (k // g)
            if left <= 0:
                return nodes
        return 1 << 30

    def fill(self, dom: int, req: Request) -> list[tuple[int, int]] | None:
        """`placement._fill` (the smallest node holding the rest, else the largest), by node."""
        g, left = req.gpus_per_replica, req.replicas
        chosen: list[tuple[int, int]] = []
        skip: set[int] = set()
        pos: dict[tuple[int, int], tuple[int, int]] = {}
        per_class = self.buckets[dom]
        while left:
            need = left * g
            best, best_k = -1, 1 << 30
            for cls in req.classes:
                bl = per_class.get(cls)
                if bl is None:
                    continue
                for k in range(need, min(len(bl), best_k)):
                    node = self.first(dom, cls, k, skip, pos)
                    if node >= 0:
                        best, best_k = node, k
                        break
            if best >= 0:
                chosen.append((best, left * g))
                break
            largest, most = -1, 0
            for cls in req.classes:
                bl = per_class.get(cls)
                if bl is None:
                    continue
                for k in range(len(bl) - 1, g - 1, -1):
                    if k // g <= most:
                        break
                    node = self.first(dom, cls, k, skip, pos)
                    if node >= 0:
                        largest, most = node, k // g
                        break
            if largest < 0:
                return None
            chosen.append((largest, most * g))
            skip.add(largest)
            left -= most
        chosen.sort()
        return chosen
