"""Free-count buckets: for every topology domain and node class, the nodes by available GPUs.

`buckets[domain][cls][k]` is the sorted list of the nodes of class `cls` inside `domain` with
exactly `k` GPUs available. Best fit is the first non-empty bucket at or above the need, and in
it the node with the lowest id; a domain's capacity for replicas of `g` GPUs is
`sum(len(b[k]) * (k // g))`. Moving a node between buckets costs two binary searches per level.

A bucket's order is a function of the nodes' available counts alone, not of the order in which
nodes moved: tentative work that is rolled back (reservation searches, backfill attempts,
victim searches) leaves no trace in later best-fit ties, so an answer computed on one state is
valid on any equal state (`reserve`'s memory relies on it).

Bucket 0 is kept empty: every reader asks for 1 GPU or more (placement sends gangs without GPUs
to its scan), and on a full cluster it would hold nearly every node, so that each move into or
out of it (a reservation held or cleared on a node with free GPUs, every cycle) shifted a list
of the cluster's size (`ZERO_BUCKET` keeps it filled, for the tests that compare).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence

Bucket = list[int]
ZERO_BUCKET = False  # True: nodes with no GPU available are kept in bucket 0 too (tests compare)


class FreeIndex:
    """Nodes bucketed by available GPUs, per domain and node class."""

    __slots__ = ("_node_lists", "avail", "buckets", "class_gpus")

    def __init__(self) -> None:
        self.buckets: list[dict[int, list[Bucket]]] = []
        self.class_gpus: list[int] = []
        self.avail: list[int] = []
        # for each node, the bucket list of every domain that holds it (root first)
        self._node_lists: list[list[list[Bucket]]] = []

    def add_class(self, gpus: int) -> int:
        self.class_gpus.append(gpus)
        return len(self.class_gpus) - 1

    def add_domain(self) -> None:
        self.buckets.append({})

    def add_node(self, node: int, cls: int, domains: Sequence[int]) -> None:
        size = self.class_gpus[cls] + 1
        lists = []
        for dom in domains:
            per_class = self.buckets[dom]
            bl = per_class.get(cls)
            if bl is None:
                bl = per_class[cls] = [[] for _ in range(size)]
            if ZERO_BUCKET:
                insort(bl[0], node)
            lists.append(bl)
        self._node_lists.append(lists)
        self.avail.append(0)

    def move(self, node: int, new: int) -> None:
        old = self.avail[node]
        if old == new:
            return
        self.avail[node] = new
        zero = ZERO_BUCKET
        for bl in self._node_lists[node]:
            if old or zero:
                bucket = bl[old]
                del bucket[bisect_left(bucket, node)]
            if new or zero:
                insort(bl[new], node)

    def best_fit(self, domain: int, classes: Iterable[int], need: int) -> int:
        """The node with the fewest available GPUs that still has `need`; -1 when none."""
        best, best_k = -1, 1 << 30
        per_class = self.buckets[domain]
        for cls in classes:
            bl = per_class.get(cls)
            if bl is None:
                continue
            for k in range(need, min(len(bl), best_k)):
                bucket = bl[k]
                if bucket:
                    best, best_k = bucket[0], k
                    break
        return best

    def capacity(self, domain: int, classes: Iterable[int], gpus_per_replica: int) -> tuple[int, int]:
        """(replicas of `gpus_per_replica` that fit, available GPUs) inside a domain."""
        replicas = total = 0
        per_class = self.buckets[domain]
        for cls in classes:
            bl = per_class.get(cls)
            if bl is None:
                continue
            for k in range(1, len(bl)):
                count = len(bl[k])
                if count:
                    total += count * k
                    replicas += count * (k // gpus_per_replica)
        return replicas, total

    def nodes_needed(self, domain: int, classes: Iterable[int], gpus_per_replica: int, replicas: int) -> int:
        """Fewest nodes of the domain that hold `replicas` (largest first); 1 << 30 when they cannot."""
        per_k: dict[int, int] = {}
        per_class = self.buckets[domain]
        for cls in classes:
            bl = per_class.get(cls)
            if bl is None:
                continue
            for k in range(gpus_per_replica, len(bl)):
                if bl[k]:
                    per_k[k] = per_k.get(k, 0) + len(bl[k])
        left, nodes = replicas, 0
        for k in sorted(per_k, reverse=True):
            fit = k // gpus_per_replica
            count = per_k[k]
            take = min(count, -(-left // fit))
            nodes += take
            left -= take * fit
            if left <= 0:
                return nodes
        return 1 << 30

    def nodes_by_avail(
        self, domain: int, classes: Iterable[int], at_least: int, descending: bool
    ) -> list[int]:
        """Nodes of a domain with at least `at_least` available GPUs, ordered by availability."""
        per_class = self.buckets[domain]
        by_k: list[tuple[int, int]] = []
        for cls in classes:
            bl = per_class.get(cls)
            if bl is None:
                continue
            for k in range(max(at_least, 1), len(bl)):
                by_k.extend((k, n) for n in bl[k])
        by_k.sort(key=lambda kn: -kn[0] if descending else kn[0])
        return [n for _, n in by_k]
