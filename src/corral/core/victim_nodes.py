"""Where a victim search's candidates are (`preempt._full_scan`): per node a gang may use (of an
allowed class, schedulable), the candidates on it in victim order, each with the GPUs it holds
there. A cycle remembers the answer per node classes for one ranked list (`preempt.Ranked`: the
same list object, which the memory keeps alive) while no queue's counted GPUs and nothing of
the state but reserved GPUs change (`ClusterState.use_version`, `base_id`): the jobs of one
preemptor key that search one after another read the same nodes.
"""

from __future__ import annotations

from corral.core.jobs import RunningAttempt
from corral.core.state import ClusterState

REMEMBER_NODES = True  # False: built for every search (tests compare)

OnNode = dict[int, list[tuple[int, RunningAttempt, int]]]  # node -> (rank, attempt, its GPUs there)
Held = dict[int, int]  # node -> the GPUs its candidates hold there, together
# node classes -> (ranked candidates, use version, base id, their nodes, what they hold): one cycle's
NodesMemo = dict[tuple[int, ...], tuple[list[RunningAttempt], int, int, OnNode, Held]]


def on_nodes(
    state: ClusterState, candidates: list[RunningAttempt], classes: tuple[int, ...], memo: NodesMemo | None
) -> tuple[OnNode, Held]:
    """Per usable node of `classes`, its candidates in the order of `candidates`, and the GPUs
    they hold there together (neither changed by callers)."""
    if memo is not None and REMEMBER_NODES:
        found = memo.get(classes)
        if (
            found is not None
            and found[0] is candidates
            and found[1] == state.use_version
            and found[2] == state.base_id
        ):
            return found[3], found[4]
    allowed = set(classes)
    node_class, is_schedulable = state.node_class, state.is_schedulable
    usable: dict[int, bool] = {}  # node -> of an allowed class and schedulable
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
    if memo is not None and REMEMBER_NODES:
        memo[classes] = (candidates, state.use_version, state.base_id, on_node, held)
    return on_node, held
