"""The network tree: levels from node labels (outermost first), domains, and placement spans.

A *domain* is the root (the whole cluster) or one value of one level (one spine, one leaf).
A *span* is how far a placement reaches, from tightest to loosest: one NVLink domain, one
node, then the cluster file's levels from the innermost out, then the whole cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from corral.core.model import PACK_NODE, PACK_NVLINK, NodeSpec

CLUSTER = "cluster"


@dataclass(slots=True)
class Domain:
    """One node of the network tree above the machines."""

    id: int
    depth: int  # 0 = cluster root, 1 = outermost level, ...
    path: tuple[str, ...]  # label values from the outermost level down to this domain
    nodes: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return "/".join(self.path) if self.path else CLUSTER


class ClusterTopology:
    """Domains of every level and, for each node, the domains that contain it (root first)."""

    def __init__(self, levels: Sequence[str]) -> None:
        self.levels: tuple[str, ...] = tuple(levels)
        self.domains: list[Domain] = [Domain(0, 0, ())]
        self._by_path: dict[tuple[str, ...], int] = {(): 0}
        self.node_domains: list[tuple[int, ...]] = []
        # domain ids per depth (index 0: [root])
        self.by_depth: list[list[int]] = [[0]] + [[] for _ in self.levels]
        self._span_names: tuple[str, ...] = (PACK_NVLINK, PACK_NODE, *reversed(self.levels), CLUSTER)

    def add_node(self, spec: NodeSpec) -> tuple[int, ...]:
        """Place a new node (the next node id) in the tree; returns its domains, root first."""
        node_id = len(self.node_domains)
        chain = [0]
        path: tuple[str, ...] = ()
        for depth, level in enumerate(self.levels, start=1):
            path = (*path, spec.labels.get(level, ""))
            dom = self._by_path.get(path)
            if dom is None:
                dom = len(self.domains)
                self.domains.append(Domain(dom, depth, path))
                self._by_path[path] = dom
                self.by_depth[depth].append(dom)
            chain.append(dom)
        for dom in chain:
            self.domains[dom].nodes.append(node_id)
        result = tuple(chain)
        self.node_domains.append(result)
        return result

    # Spans, tightest first: nvlink, node, innermost level ... outermost level, cluster.
    @property
    def span_names(self) -> tuple[str, ...]:
        return self._span_names

    def span_index(self, name: str) -> int:
        """Index of a pack level among the spans; ValueError names the known ones."""
        names = self.span_names
        if name not in names:
            raise ValueError(f"unknown pack level {name!r}; known: {', '.join(names)}")
        return names.index(name)

    def depth_of_span(self, span: int) -> int:
        """The domain depth of a span above the node (span 2 = innermost level)."""
        return len(self.levels) - (span - 2)

    def span_of(self, nodes: Sequence[int], nvlink_groups: int) -> int:
        """The tightest span that holds these nodes (nvlink_groups: groups used on a single node)."""
        if len(set(nodes)) <= 1:
            return 0 if nvlink_groups <= 1 else 1
        chains = [self.node_domains[n] for n in nodes]
        for depth in range(len(self.levels), 0, -1):
            if len({c[depth] for c in chains}) == 1:
                return 2 + (len(self.levels) - depth)
        return len(self.span_names) - 1
