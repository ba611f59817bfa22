"""What the reservation search of a gang of whole nodes read (`first_release.WholeNodes`), so
that its answer outlives the changes it cannot see (`reserve.earliest_fit`).

Such a search (a countable gang of whole nodes that may spread over the cluster; its answer
found at the first release after which the cluster has replicas enough) reads, of the state
apart from the reserved GPUs, only which nodes of the gang's classes are:
- *free*: at a replica's GPUs or more now (the index);
- *before*: wholly released at a replica's GPUs or more by an end key earlier than `key`, the
  end key of the attempt whose end gives the cluster replicas enough (`WholeNodes.reached`);
- *at*: the same, wholly released by `key` itself (the nodes of one gang's attempt share it:
  which of them count before the rest is read by node id);
- and that no node wholly released by `key` is held whole by two attempts (`NeedsAll`).
Where `key` lies, and which nodes are taken (`counted.place_counts(..., whole=True)` reads the
free and wholly released nodes, `place_counts` is monotone in them and the gang fits where its
replicas are counted), follows from these three sets. A search that never reaches replicas
enough reads the same with `key` past every finite end (`NEVER`).

Every change of a node's GPUs, up state, exclusive flag or attempts' ends (apart from its
reserved GPUs, which the memory compares whole) is logged (`NodeTable.node_log`); the answer
holds while every node logged since it was found (or last checked) is in the set it was in
then (`unchanged`). The log is trimmed at the end of each cycle (`NodeTable.trim_log`); a memory
older than the log is searched again. `tests/core/test_fit_reads.py` compares with searching
every time (`reserve.READS`).
"""

from __future__ import annotations

from corral.core.counted import NeedsAll
from corral.core.first_release import wholly_free
from corral.core.model import INFINITY, JobId
from corral.core.placement import Request
from corral.core.state import ClusterState

NEVER: tuple[float, int, JobId] = (INFINITY, 0, JobId(""))  # past every finite end key (seq >= 1)
_OUT, _FREE, _BEFORE, _AT, _NEEDS_ALL = 0, 1, 2, 3, 4


class Reads:
    """What one search of a gang of whole nodes read: see the module's docstring."""

    __slots__ = ("allowed", "at", "before", "free", "g", "key", "stamp")

    def __init__(
        self, state: ClusterState, req: Request, key: tuple[float, int, JobId], wholly: list[int]
    ) -> None:
        """`wholly`: the nodes wholly released at `g` GPUs or more by `key` (in any order)."""
        g = req.gpus_per_replica
        self.g, self.key, self.allowed = g, key, set(req.classes)
        self.stamp = state.log_from + len(state.node_log)
        free: set[int] = set()
        roots = state.index.buckets[0]
        for cls in req.classes:
            bl = roots.get(cls)
            if bl is not None:
                for k in range(g, len(bl)):
                    free.update(bl[k])
        before: set[int] = set()
        at: set[int] = set()
        node_ends = state.node_ends
        for node in wholly:
            (at if node_ends[node][-1] == key else before).add(node)
        self.free, self.before, self.at = free, before, at

    def _was(self, node: int) -> int:
        if node in self.free:
            return _FREE
        if node in self.before:
            return _BEFORE
        return _AT if node in self.at else _OUT

    def _now(self, state: ClusterState, node: int) -> int:
        if state.node_class[node] not in self.allowed:
            return _OUT
        g = self.g
        if state.index.avail[node] >= g:
            return _FREE
        keys = state.node_ends.get(node)
        if keys is None:
            return _OUT
        last = keys[-1]
        if last > self.key:
            return _OUT
        try:
            if wholly_free(state, node) < g:
                return _OUT
        except NeedsAll:
            return _NEEDS_ALL
        return _AT if last == self.key else _BEFORE

    def unchanged(self, state: ClusterState) -> bool:
        """Whether every node logged since the search (or the last check) is in the set it was in
        then (the reserved GPUs as they were then: the caller compares them); moves the check on."""
        log, i = state.node_log, self.stamp - state.log_from
        if i < 0:
            return False  # (trimmed: not known)
        n = len(log)
        seen: set[int] = set()
        while i < n:
            node = log[i]
            i += 1
            if node in seen:
                continue
            seen.add(node)
            if self._now(state, node) != self._was(node):
                return False
        self.stamp = state.log_from + n
        return True
