"""From a job to what placement needs: the node classes it may use and its pack level; and the
most replicas of a gang a domain holds when empty (`core.rejections` says why a job never fits).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from corral.core.jobs import shape_of
from corral.core.model import JobSpec, Launch
from corral.core.nodes import NodeClass
from corral.core.placement import Request
from corral.core.state import ClusterState


def allows(spec: JobSpec, node_class: NodeClass) -> bool:
    """The built-in filters: GPU model (glob), GPU memory, labels, GPUs per node."""
    node = node_class.spec
    if spec.gpus_per_replica > node.gpus:
        return False
    if spec.gpu_model and not any(fnmatchcase(node.gpu_model, pattern) for pattern in spec.gpu_model):
        return False
    if spec.gpu_memory_gib and node.gpu_memory_gib < spec.gpu_memory_gib:
        return False
    if spec.cpus_per_replica and node.cpus and spec.cpus_per_replica > node.cpus:
        return False
    if spec.memory_gib_per_replica and node.memory_gib and spec.memory_gib_per_replica > node.memory_gib:
        return False
    return all(node.labels.get(k) == v for k, v in spec.node_selector.items())


def request_for(
    state: ClusterState,
    spec: JobSpec,
    shape: tuple[object, ...] | None = None,
) -> Request:
    """The placement request of a job, cached per shape until the cluster's capacity changes."""
    cache = state.caches.requests
    key = shape or shape_of(spec)
    cached = cache.get(key)
    if cached is not None:
        return cached
    classes = tuple(c.id for c in state.classes if allows(spec, c))
    last = len(state.topology.span_names) - 1
    max_span = last
    if spec.topology.pack is not None and spec.topology.required:
        max_span = state.topology.span_index(spec.topology.pack)
    total = spec.gpus
    req = Request(
        spec.replicas,
        spec.gpus_per_replica,
        classes,
        max_span,
        spec.launch is Launch.PER_NODE,
        spec.cpus_per_replica,
        spec.memory_gib_per_replica,
        tuple(c for c in classes if state.classes[c].nvlink_groups == 1),
        tuple(
            c
            for c in classes
            if state.classes[c].nvlink_groups > 1 and state.classes[c].largest_group >= total
        ),
    )
    cache[key] = req
    return req


def static_capacity(state: ClusterState, req: Request, span: int) -> int:
    """Most replicas of the gang that one domain of `span` holds when every node is empty (cached)."""
    cache = state.caches.static_capacity
    cached = cache.get((req, span))
    if cached is None:
        cached = cache[req, span] = _static_capacity(state, req, span)
    return cached


def _static_capacity(state: ClusterState, req: Request, span: int) -> int:
    allowed = set(req.classes)
    topo = state.topology
    g = req.gpus_per_replica

    def replicas_on(node: int) -> int:
        if state.node_class[node] not in allowed:
            return 0
        if req.per_node or g == 0:
            return 1
        return state.specs[node].gpus // g

    if span <= 1:
        best = max((replicas_on(n) for n in range(len(state.specs))), default=0)
        if span == 0:
            groups = max((state.classes[c].largest_group for c in req.classes), default=0)
            return req.replicas if groups >= req.gpus else 0
        return best
    last = len(topo.span_names) - 1
    depth = 0 if span >= last else topo.depth_of_span(span)
    return max((sum(replicas_on(n) for n in topo.domains[d].nodes) for d in topo.by_depth[depth]), default=0)
