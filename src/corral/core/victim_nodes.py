"""Where a victim search's candidates are (`preempt._full_scan`): per node a gang may use (of an
allowed class, schedulable), the candidates on it in victim order, each with the GPUs it holds
there. A cycle remembers the answer per node classes for one ranked list (`preempt.Ranked`: the
same list object, which the memory keeps alive) while no queue's counted GPUs and nothing of
the state but reserved GPUs change (`ClusterState.use_version`, `base_id`): the jobs of one
preemptor key that search one after another read the same nodes.

After a nomination (or a start) the ranking that follows is the one before less the attempts
that stopped being candidates (`preempt.ranked_candidates`): then the nodes are not built anew
but derived from the remembered ones (`_less`, switch `DERIVE_NODES`): the list is checked to be
the remembered one less some attempts (in the same order), and only the nodes of those attempts
lose their entries. An entry keeps its rank in the remembered list: ranks only order the entries
(`preempt._full_scan`'s costs compare them), and dropping attempts keeps their order.

Where they would be built, a search first checks that the candidates' GPUs and the free ones
together hold the job's replicas at all (`_too_few`, switch `FEW_FIRST`): the gangs of the
overload trace that no set of victims frees (two searches in three that find candidates but no
set) are answered without the nodes.
"""

from __future__ import annotations

from corral.core.jobs import RunningAttempt
from corral.core.state import ClusterState

REMEMBER_NODES = True  # False: built for every search (tests compare)
DERIVE_NODES = True  # False: a ranking less some attempts is built anew too (tests compare)
FEW_FIRST = True  # False: built even where the candidates' GPUs cannot hold the job (tests compare)

OnNode = dict[int, list[tuple[int, RunningAttempt, int]]]  # node -> (rank, attempt, its GPUs there)
Held = dict[int, int]  # node -> the GPUs its candidates hold there, together
Usable = dict[int, bool]  # node -> of an allowed class and schedulable, as read by the build
# node classes -> (ranked candidates, use version, base id, their nodes, what they hold, the nodes
# read)
Built = dict[tuple[int, ...], tuple[list[RunningAttempt], int, int, OnNode, Held, Usable]]


class NodesMemo:
    """One cycle's memory of `on_nodes`: what it built, and the last ranked list whose GPUs
    `_too_few` added up (the list, kept alive so that no other takes its place, and its GPUs)."""

    __slots__ = ("built", "counted")

    def __init__(self) -> None:
        self.built: Built = {}
        self.counted: tuple[list[RunningAttempt] | None, int] = (None, 0)


def on_nodes(
    state: ClusterState,
    candidates: list[RunningAttempt],
    classes: tuple[int, ...],
    memo: NodesMemo | None,
    replicas: int = 0,
    per_replica: int = 1,
) -> tuple[OnNode, Held] | None:
    """Per usable node of `classes`, its candidates in the order of `candidates` (each with a rank
    that orders them as `candidates` does), and the GPUs they hold there together (neither changed
    by callers). None (only with `replicas`: the replicas of `per_replica` GPUs of a job that is not
    launched per node) instead of building them where no node set can hold the replicas."""
    found = memo.built.get(classes) if memo is not None and REMEMBER_NODES else None
    if found is not None:
        if found[0] is candidates and found[1] == state.use_version and found[2] == state.base_id:
            return found[3], found[4]
        if DERIVE_NODES:
            derived = _less(state, candidates, classes, found[0], found[3], found[4], found[5])
            if derived is not None:
                assert memo is not None
                memo.built[classes] = (candidates, state.use_version, state.base_id, *derived)
                return derived[0], derived[1]
    if replicas and FEW_FIRST and _too_few(state, candidates, replicas, per_replica, memo):
        return None
    on_node, held, usable = _build(state, candidates, classes)
    if memo is not None and REMEMBER_NODES:
        memo.built[classes] = (candidates, state.use_version, state.base_id, on_node, held, usable)
    return on_node, held


def _build(
    state: ClusterState, candidates: list[RunningAttempt], classes: tuple[int, ...]
) -> tuple[OnNode, Held, Usable]:
    allowed = set(classes)
    node_class, is_schedulable = state.node_class, state.is_schedulable
    usable: Usable = {}
    on_node: OnNode = {}
    for i, a in enumerate(candidates):
        placement = a.placement
        if len(placement) == 1:
            node, mask = placement[0]
            ok_node = usable.get(node)
            if ok_node is None:
                ok_node = usable[node] = node_class[node] in allowed and is_schedulable(node)
            if ok_node:
                on_node.setdefault(node, []).append((i, a, mask.bit_count()))
            continue
        per_node: dict[int, int] = {}
        for node, mask in placement:
            per_node[node] = per_node.get(node, 0) + mask.bit_count()
        for node, gpus in per_node.items():
            ok_node = usable.get(node)
            if ok_node is None:
                ok_node = usable[node] = node_class[node] in allowed and is_schedulable(node)
            if ok_node:
                on_node.setdefault(node, []).append((i, a, gpus))
    held = {node: sum(gpus for _, _, gpus in entries) for node, entries in on_node.items()}
    return on_node, held, usable


def _less(
    state: ClusterState,
    candidates: list[RunningAttempt],
    classes: tuple[int, ...],
    before: list[RunningAttempt],
    on_node: OnNode,
    held: Held,
    usable: Usable,
) -> tuple[OnNode, Held, Usable] | None:
    """`_build`'s answer for `candidates`, derived from the one for `before`, when `candidates` is
    `before` less some attempts (in the same order) and every node read then reads alike now
    (schedulable or not); None otherwise."""
    if len(candidates) >= len(before):
        return None  # the same length: another list (the same one answered above)
    gone: list[RunningAttempt] = []
    j, n = 0, len(candidates)
    for a in before:
        if j < n and candidates[j] is a:
            j += 1
        else:
            gone.append(a)
    if j < n:
        return None  # not a part of `before`
    allowed = set(classes)
    node_class, is_schedulable = state.node_class, state.is_schedulable
    for node, ok_node in usable.items():
        if ok_node != (node_class[node] in allowed and is_schedulable(node)):
            return None  # a node read then reads otherwise now
    left = set(map(id, gone))
    touched = {node for a in gone for node, _ in a.placement if usable.get(node)}
    on_node = dict(on_node)
    held = dict(held)
    for node in touched:
        kept = [e for e in on_node[node] if id(e[1]) not in left]
        if kept:
            on_node[node] = kept
            held[node] = sum(gpus for _, _, gpus in kept)
        else:
            del on_node[node]
            del held[node]
    return on_node, held, usable


def too_few(state: ClusterState, candidates: list[RunningAttempt], replicas: int, per_replica: int) -> bool:
    """`_too_few` without a memory: whether no set of the candidates frees the replicas."""
    return _too_few(state, candidates, replicas, per_replica, None)


def _too_few(
    state: ClusterState,
    candidates: list[RunningAttempt],
    replicas: int,
    per_replica: int,
    memo: NodesMemo | None,
) -> bool:
    """Whether the free GPUs and the candidates' together hold fewer than `replicas` replicas of
    `per_replica` GPUs: then `victim_domain.choose_nodes` finds no nodes (a node's potential is at most
    its available GPUs plus what its candidates hold there; `sum(p // g) <= sum(p) // g`). A running
    attempt holds one mask of `gpus_per_replica` GPUs per replica: `spec.gpus` in all."""
    if memo is not None and REMEMBER_NODES and memo.counted[0] is candidates:
        held = memo.counted[1]
    else:
        held = 0
        for a in candidates:
            held += a.spec.gpus
        if memo is not None and REMEMBER_NODES:
            memo.counted = (candidates, held)
    return (sum(state.index.avail) + held) // per_replica < replicas
