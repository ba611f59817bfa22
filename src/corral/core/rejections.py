"""Jobs that can never run on the static capacity (DESIGN.md 4.8): which constraint binds (the
queue's limit or quota, GPUs per node, the GPU model or another filter, a required pack level,
the size of the cluster), said in a sentence with the right numbers and a fix.

The capacity counted is every node's, whatever its state, when empty. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from corral.core.decisions import CycleResult, Reject
from corral.core.jobs import shape_of
from corral.core.model import JobSpec
from corral.core.placement import Request
from corral.core.reasons import gang, plural
from corral.core.request import request_for, static_capacity
from corral.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class NeverFits:
    """Why a job can never run, and what to change: `str()` is `reason (fix: fix)`."""

    reason: str
    fix: str

    def __str__(self) -> str:
        return f"{self.reason} (fix: {self.fix})"


def never_fits(state: ClusterState, spec: JobSpec, req: Request) -> str | None:
    """Why a job can never run on the static capacity (with its fix), or None."""
    found = explain(state, spec, req)
    return None if found is None else str(found)


def explain(state: ClusterState, spec: JobSpec, req: Request) -> NeverFits | None:
    """The binding constraint of a job that can never run, or None when it can."""
    queue = state.queues.get(spec.queue)
    if queue is None:
        return NeverFits(
            f"unknown queue {spec.queue!r}", f"submit to one of: {', '.join(sorted(state.queues))}"
        )
    limit = queue.spec.limit
    if limit is not None and spec.gpus > limit:
        return NeverFits(
            f"needs {plural(spec.gpus, 'GPU')} but queue {spec.queue} is limited to {limit}",
            f"ask for at most {limit} GPUs, or submit to a queue with a higher limit",
        )
    if not spec.preemptible and spec.gpus > queue.spec.quota:
        return NeverFits(
            f"non-preemptible jobs run only inside the queue's guaranteed quota: needs {spec.gpus} GPUs, "
            f"queue {spec.queue} guarantees {queue.spec.quota}",
            "submit it as preemptible (preemptible: true)",
        )
    if not req.classes:
        return _no_node(state, spec)
    most = static_capacity(state, req, req.max_span)
    if most >= spec.replicas:
        return None
    if req.max_span == 0:
        return _nvlink(state, spec, req)
    return _too_small(state, spec, req, most)


def _no_node(state: ClusterState, spec: JobSpec) -> NeverFits:
    """No node may hold even one replica: the first constraint no node meets, else the mix."""
    specs = [c.spec for c in state.classes]
    g = spec.gpus_per_replica
    largest = max((n.gpus for n in specs), default=0)
    if g > largest:
        return NeverFits(
            f"needs {plural(g, 'GPU')} per replica; the largest node has {largest}",
            f"use more replicas of at most {largest} GPUs each (--replicas, --gpus-per-replica)",
        )
    models = sorted({n.gpu_model for n in specs if n.gpu_model})
    if spec.gpu_model and not any(fnmatchcase(n.gpu_model, p) for n in specs for p in spec.gpu_model):
        wanted = "|".join(spec.gpu_model)
        return NeverFits(
            f"no node has GPUs of model {wanted}; models in the cluster: {', '.join(models) or 'none named'}",
            "ask for a model the cluster has (--gpu-model), or leave the model out",
        )
    if spec.gpu_memory_gib and all(n.gpu_memory_gib < spec.gpu_memory_gib for n in specs):
        most = max(n.gpu_memory_gib for n in specs)
        return NeverFits(
            f"needs GPUs of {spec.gpu_memory_gib:g} GiB; the most any node's GPUs have is {most:g} GiB",
            f"ask for at most {most:g} GiB per GPU",
        )
    for key, value in spec.node_selector.items():
        if all(n.labels.get(key) != value for n in specs):
            return NeverFits(
                f"no node is labelled {key}={value}", "fix the node selector, or label a node so"
            )
    if spec.cpus_per_replica and all(n.cpus and spec.cpus_per_replica > n.cpus for n in specs):
        most_cpus = max(n.cpus for n in specs)
        return NeverFits(
            f"needs {spec.cpus_per_replica} CPUs per replica; the largest node has {most_cpus}",
            f"ask for at most {most_cpus} CPUs per replica, or use more, smaller replicas",
        )
    return NeverFits(
        f"no node meets all of the job's constraints at once: {_constraints(spec) or 'the policy filters'}"
        f" with {plural(g, 'GPU')} per replica",
        "relax one of them",
    )


def _nvlink(state: ClusterState, spec: JobSpec, req: Request) -> NeverFits:
    """A gang that must fit one NVLink domain, larger than any allowed node's largest."""
    largest = max(state.classes[c].largest_group for c in req.classes)
    which = f" of the nodes with {_constraints(spec)}" if _constraints(spec) else ""
    return NeverFits(
        f"needs {gang(spec.replicas, spec.gpus_per_replica)} inside one NVLink domain (required); "
        f"the largest NVLink domain{which} holds {plural(largest, 'GPU')}",
        f"pack node instead (--pack node: NVLink domains of one node), or ask for at most {largest} GPUs",
    )


def _too_small(state: ClusterState, spec: JobSpec, req: Request, most: int) -> NeverFits:
    """Too many replicas for any allowed domain of its span: the required level, the filters that
    leave too few nodes, or the cluster itself."""
    g, reps = spec.gpus_per_replica, spec.replicas
    names = state.topology.span_names
    last = len(names) - 1
    scope = names[req.max_span]
    replicas = f"{plural(reps, 'replica')} of {plural(g, 'GPU')}"
    which = _constraints(spec)
    if req.max_span < last and static_capacity(state, req, last) >= reps:
        where = "node" if scope == "node" else scope
        of = f" (nodes with {which})" if which else ""
        return NeverFits(
            f"needs {replicas} inside one {where} (required); the largest {where}{of} holds "
            f"{plural(most, 'replica')} even when empty",
            f"drop the requirement (--pack {scope} without --pack-required), or ask for at most "
            f"{plural(most, 'replica')}",
        )
    every = tuple(c.id for c in state.classes)  # the same gang on any node
    anywhere = Request(reps, g, every, last, req.per_node, req.cpus, req.memory)
    full = static_capacity(state, req, last)
    if which and static_capacity(state, anywhere, last) >= reps:
        allowed = set(req.classes)
        nodes = [str(n.name) for i, n in enumerate(state.specs) if state.node_class[i] in allowed]
        shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        other = sorted({c.spec.gpu_model for c in state.classes if c.id not in allowed and c.spec.gpu_model})
        if spec.gpu_model and other:
            widen = f"accept other models too (--gpu-model {' --gpu-model '.join(other)})"
        else:
            widen = f"relax {which}"
        return NeverFits(
            f"needs {replicas} with {which}; the nodes with it ({shown}) hold at most "
            f"{plural(full, 'replica')} even when empty",
            f"ask for at most {plural(full, 'replica')}, or {widen}",
        )
    total = sum(n.gpus for n in state.specs)
    return NeverFits(
        f"needs {replicas}; the whole cluster ({plural(total, 'GPU')}) holds at most "
        f"{plural(full, 'replica')} of {plural(g, 'GPU')} even when empty",
        f"ask for at most {plural(full, 'replica')}, or fewer GPUs per replica",
    )


def _constraints(spec: JobSpec) -> str:
    """What the job asks of a node beyond GPUs, e.g. `GPU model A100*`, or '' when nothing."""
    parts = []
    if spec.gpu_model:
        parts.append(f"GPU model {'|'.join(spec.gpu_model)}")
    if spec.gpu_memory_gib:
        parts.append(f"{spec.gpu_memory_gib:g} GiB per GPU")
    parts += [f"label {k}={v}" for k, v in sorted(spec.node_selector.items())]
    if spec.cpus_per_replica:
        parts.append(f"{spec.cpus_per_replica} CPUs per replica")
    if spec.memory_gib_per_replica:
        parts.append(f"{spec.memory_gib_per_replica:g} GiB of memory per replica")
    return ", ".join(parts)


def reject_never_fitting(state: ClusterState, result: CycleResult) -> None:
    """Reject the newly submitted jobs that can never run on the static capacity (the first step
    of a cycle); each job's request is computed here once."""
    for job in state.unchecked:
        if job.spec.id not in state.jobs:
            continue
        if job.shape is None:
            job.shape = shape_of(job.spec)
        req = request_for(state, job.spec, job.shape)
        job.request, job.request_generation = req, state.generation
        # the answer depends only on the verdict key's fields (shape, queue, preemptible) and on
        # static capacity: cached per key until the capacity changes (`state.caches` is replaced)
        cache = state.caches.never_fits
        key = job.verdict_key
        if job.verdict_key >= 0 and key in cache:
            why = cache[key]
        else:
            why = cache[key] = never_fits(state, job.spec, req)
        if why is not None:
            state.remove_pending(job.spec.id)
            result.rejections.append(Reject(job.spec.id, why))
    state.unchecked.clear()
