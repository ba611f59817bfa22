"""The nodes' side of the cluster state: GPU masks, CPUs and memory per node, the free-count
index, and every change of them (through the plan, or by adapters between cycles).

`ClusterState` (`state.py`) adds queues, pending jobs and running attempts to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.caches import Caches
from corral.core.errors import InvariantError
from corral.core.index import FreeIndex
from corral.core.model import NodeName, NodeSpec, NodeState
from corral.core.occupancy import Occupancy
from corral.core.plan import Plan
from corral.core.topology import ClusterTopology

if TYPE_CHECKING:
    from corral.core.placement import Request


# a change of reserved GPUs alone skips the move in the index of a node that offers nothing before
# and after it (no free GPU beyond its reserved ones, and none offered now); False: always moved
STILL_NODES = True


@dataclass(frozen=True, slots=True)
class NodeClass:
    """Nodes that a filter cannot tell apart: same GPUs, model, memory, CPUs, NVLink and labels."""

    id: int
    spec: NodeSpec  # the first node of the class, for filters
    nvlink_groups: int
    largest_group: int


@dataclass(frozen=True, slots=True)
class Released:
    """What `NodeTable.give_back_many` changed: each node's allocated mask, CPUs, memory, exclusive
    flag and index counts before, and the base ids before and after."""

    saved: dict[int, tuple[int, int, float, bool, int, int, int, int]]  # ... and free counts
    before: int
    after: int


class NodeTable:
    """The nodes of a `ClusterState` and their GPUs, changed only through `plan` (or by adapters
    between cycles)."""

    def __init__(self, levels: Sequence[str] = ()) -> None:
        self.topology = ClusterTopology(levels)
        self.plan = Plan()
        self.index = FreeIndex()
        self.nvl_index = FreeIndex()  # root-level buckets by free GPUs in the best NVLink group
        self.index.add_domain()
        self.nvl_index.add_domain()
        self.specs: list[NodeSpec] = []
        self.node_ids: dict[NodeName, int] = {}
        self.node_class: list[int] = []
        self.classes: list[NodeClass] = []
        self._class_keys: dict[tuple[object, ...], int] = {}
        self.group_masks: list[tuple[int, ...]] = []
        self.node_state: list[NodeState] = []
        self.unschedulable: set[int] = set()  # nodes not up (cordoned, draining, down, lost)
        self.healthy: list[int] = []
        self.alloc: list[int] = []
        self.held: list[int] = []
        self.reserved: list[int] = []
        self.exclusive: list[bool] = []
        self.free_cpus: list[int] = []
        self.free_memory: list[float] = []
        # per node, as `_refresh` last saw it: free GPUs (`free_mask`'s count) and the most free in
        # one NVLink group (nodes with several; -1: not counted yet), so that a change of reserved
        # GPUs alone, the most frequent (reservations held, lifted and dropped), recounts no mask
        # (`_set_reserved_raw`)
        self.free_count: list[int] = []
        self.group_free: list[int] = []
        self.total_gpus = self.total_cpus = 0
        self.total_memory = 0.0
        self.occupancy = Occupancy()
        self.generation = 0  # bumped whenever static capacity changes (nodes, queues)
        self.caches = Caches()
        # bumped whenever a node's GPUs change (allocated, held, reserved, healthy, up, exclusive):
        # every such change goes through `_refresh`
        self.node_version = 0
        # names the state apart from reserved GPUs: a fresh id after every other change of what a
        # reservation search reads (GPUs, CPUs, memory, nodes, running attempts and their ends);
        # undoing a change through the plan gives back the id from before it (the index keeps no
        # trace of tentative work: `index`), so equal ids mean equal states
        self.base_id = 0
        self._last_id = 0
        self.reserved_at: dict[int, int] = {}  # node -> reserved GPUs, where any
        # `reserve.earliest_fit` answers per request, the latest few: (base id, reserved GPUs,
        # answer, and what the search read where it tells when an answer outlives a change:
        # `fit_reads.Reads`)
        self.fit_memo: dict[Request, list[tuple[int, tuple[tuple[int, int], ...], object, object]]] = {}
        # the nodes whose GPUs, up state, exclusive flag or attempts' ends changed, in order (not
        # their reserved GPUs alone); `log_from`: the position of its first entry since the start
        # (`fit_reads`; trimmed at the end of each cycle, `trim_log`)
        self.node_log: list[int] = []
        self.log_from = 0
        # `reserve.misses_lifted` answers at one node version, per (request, reservations lifted)
        self.lift_memo: tuple[int, dict[tuple[Request, tuple[tuple[str, float], ...]], bool]] = (-1, {})

    def add_node(self, spec: NodeSpec, state: NodeState = NodeState.UP) -> int:
        if spec.name in self.node_ids:
            raise ValueError(f"node {spec.name} is already in the cluster")
        node = len(self.specs)
        topo_labels = set(self.topology.levels)
        key = (
            spec.gpus,
            spec.gpu_model,
            spec.gpu_memory_gib,
            spec.cpus,
            spec.memory_gib,
            spec.nvlink,
            tuple(sorted((k, v) for k, v in spec.labels.items() if k not in topo_labels)),
        )
        cls = self._class_keys.get(key)
        if cls is None:
            cls = self.index.add_class(spec.gpus)
            self.nvl_index.add_class(spec.gpus)
            self._class_keys[key] = cls
            largest = max((len(g) for g in spec.nvlink), default=0)
            self.classes.append(NodeClass(cls, spec, len(spec.nvlink), largest))
        before = len(self.topology.domains)
        domains = self.topology.add_node(spec)
        for _ in range(len(self.topology.domains) - before):
            self.index.add_domain()
        self.index.add_node(node, cls, domains)
        self.nvl_index.add_node(node, cls, (0,))
        self.specs.append(spec)
        self.node_ids[spec.name] = node
        self.occupancy.add_node()
        self.node_class.append(cls)
        self.group_masks.append(tuple(sum(1 << i for i in g) for g in spec.nvlink))
        self.node_state.append(state)
        if state is not NodeState.UP:
            self.unschedulable.add(node)
        self.healthy.append((1 << spec.gpus) - 1)
        self.alloc.append(0)
        self.held.append(0)
        self.reserved.append(0)
        self.exclusive.append(False)
        self.free_cpus.append(spec.cpus)
        self.free_memory.append(spec.memory_gib)
        self.free_count.append(0)
        self.group_free.append(0)
        self.total_gpus += spec.gpus
        self.total_cpus += spec.cpus
        self.total_memory += spec.memory_gib
        self.generation += 1
        self.caches = Caches()
        self.fit_memo = {}
        self._new_id()
        self._refresh(node)
        return node

    def set_node_state(self, name: NodeName, state: NodeState) -> None:
        node = self.node_ids[name]
        self.node_state[node] = state
        self._new_id()
        if state is NodeState.UP:
            self.unschedulable.discard(node)
        else:
            self.unschedulable.add(node)
        self._refresh(node)

    def set_gpu_health(self, name: NodeName, gpu: int, healthy: bool) -> None:
        node = self.node_ids[name]
        bit = 1 << gpu
        self.healthy[node] = (self.healthy[node] | bit) if healthy else (self.healthy[node] & ~bit)
        self._new_id()
        self._refresh(node)

    def free_mask(self, node: int) -> int:
        """GPUs of a node that are healthy, unallocated and not held for a nominated job."""
        return self.healthy[node] & ~self.alloc[node] & ~self.held[node]

    def is_schedulable(self, node: int) -> bool:
        return self.node_state[node] is NodeState.UP and not self.exclusive[node]

    def available(self, node: int, alloc: int, exclusive: bool) -> int:
        """A node's available GPUs (healthy, not allocated, not held, minus reserved) were its
        allocated mask `alloc` and its exclusive flag `exclusive`: 0 unless it is up."""
        if self.node_state[node] is not NodeState.UP or exclusive:
            return 0
        free = self.healthy[node] & ~alloc & ~self.held[node]
        return max(0, free.bit_count() - self.reserved[node])

    def available_lifting(self, node: int, gpus: int) -> int:
        """A node's available GPUs were `gpus` of its reserved GPUs given back."""
        if self.node_state[node] is not NodeState.UP or self.exclusive[node]:
            return 0
        return max(0, self.free_count[node] - self.reserved[node] + gpus)

    def _new_id(self) -> None:
        self._last_id += 1
        self.base_id = self._last_id

    def _refresh(self, node: int) -> None:
        """Recount a node's free GPUs (`free_count`, `group_free`) and move it in the buckets."""
        free = self.healthy[node] & ~self.alloc[node] & ~self.held[node]
        self.free_count[node] = free.bit_count()
        self.group_free[node] = -1  # counted when first needed (`_move`)
        self.node_log.append(node)
        self._move(node)

    def _move(self, node: int) -> None:
        """Move a node in the buckets to its available count (`available`, inlined from the free
        counts: the hottest path of tentative work)."""
        self.node_version += 1
        if self.node_state[node] is not NodeState.UP or self.exclusive[node]:
            self.index.move(node, 0)
            self.nvl_index.move(node, 0)
            return
        avail = self.free_count[node] - self.reserved[node]
        if avail <= 0:
            self.index.move(node, 0)
            self.nvl_index.move(node, 0)
            return
        self.index.move(node, avail)
        masks = self.group_masks[node]
        if len(masks) > 1:
            best = self.group_free[node]
            if best < 0:
                free = self.healthy[node] & ~self.alloc[node] & ~self.held[node]
                best = self.group_free[node] = max((free & m).bit_count() for m in masks)
            self.nvl_index.move(node, min(best, avail))

    # ---- tentative changes, through the plan -------------------------------------------
    def take(self, node: int, mask: int, cpus: int, memory: float, exclusive: bool) -> None:
        """Allocate GPUs (and CPUs, memory) of a node; undone by rollback."""
        if self.alloc[node] & mask:
            raise InvariantError(f"GPU mask {mask:#x} of node {self.specs[node].name} is already allocated")
        before = self.base_id
        self._hold_resources(node, mask, cpus, memory, exclusive, True)
        self.plan.record(self._undo_hold, node, mask, cpus, memory, exclusive, False, before, self.base_id)

    def give_back(self, node: int, mask: int, cpus: int, memory: float, exclusive: bool) -> None:
        """Release GPUs of a node; undone by rollback."""
        if self.alloc[node] & mask != mask:
            raise InvariantError(f"GPU mask {mask:#x} of node {self.specs[node].name} is not allocated")
        before = self.base_id
        self._hold_resources(node, mask, cpus, memory, exclusive, False)
        self.plan.record(self._undo_hold, node, mask, cpus, memory, exclusive, True, before, self.base_id)

    def _undo_hold(
        self,
        node: int,
        mask: int,
        cpus: int,
        memory: float,
        exclusive: bool,
        held: bool,
        before: int,
        after: int,
    ) -> None:
        """Undo a change that moved the base id from `before` to `after`: the state is the one named
        `before` again, unless some change outside the plan came in between (a fresh id then)."""
        same = self.base_id == after
        self._hold_resources(node, mask, cpus, memory, exclusive, held)
        if same:
            self.base_id = before

    def _hold_resources(
        self, node: int, mask: int, cpus: int, memory: float, exclusive: bool, held: bool
    ) -> None:
        """Mark a node's GPUs (and CPUs, memory) allocated or free, outside the plan."""
        sign = 1 if held else -1
        self.alloc[node] = self.alloc[node] | mask if held else self.alloc[node] & ~mask
        self.free_cpus[node] -= sign * cpus
        self.free_memory[node] -= sign * memory
        if exclusive:
            self.exclusive[node] = held
        self._new_id()
        self._refresh(node)

    def give_back_many(self, releases: Sequence[tuple[int, int, int, float, bool]]) -> Released:
        """Release (node, GPU mask, CPUs, memory, exclusive) in order, outside the plan, moving each
        node in the index once (its buckets are a function of the final counts alone, so this
        leaves the state that giving each back in turn leaves); `restore` undoes it. For tentative
        work that the caller undoes before anything else changes (`reserve`)."""
        alloc, cpus, memory, exclusive = self.alloc, self.free_cpus, self.free_memory, self.exclusive
        index_avail, nvl_avail = self.index.avail, self.nvl_index.avail
        free_count, group_free = self.free_count, self.group_free
        saved: dict[int, tuple[int, int, float, bool, int, int, int, int]] = {}
        for node, mask, c, m, e in releases:
            if node not in saved:
                saved[node] = (
                    alloc[node],
                    cpus[node],
                    memory[node],
                    exclusive[node],
                    index_avail[node],
                    nvl_avail[node],
                    free_count[node],
                    group_free[node],
                )
            if alloc[node] & mask != mask:
                raise InvariantError(f"GPU mask {mask:#x} of node {self.specs[node].name} is not allocated")
            alloc[node] &= ~mask
            cpus[node] += c
            memory[node] += m
            if e:
                exclusive[node] = False
        for node in saved:
            self._refresh(node)
        before = self.base_id
        self._new_id()
        return Released(saved, before, self.base_id)

    def restore(self, released: Released) -> None:
        """Undo `give_back_many` (after rolling the plan back to where it was then)."""
        alloc, cpus, memory, exclusive = self.alloc, self.free_cpus, self.free_memory, self.exclusive
        index, nvl_index, free_count, group_free = (
            self.index,
            self.nvl_index,
            self.free_count,
            self.group_free,
        )
        log = self.node_log
        for node, (a, c, m, e, avail, nvl, count, group) in released.saved.items():
            log.append(node)
            alloc[node], cpus[node], memory[node], exclusive[node] = a, c, m, e
            free_count[node], group_free[node] = count, group
            index.move(node, avail)
            nvl_index.move(node, nvl)
        self.node_version += 1
        if self.base_id == released.after:
            self.base_id = released.before
        else:
            self._new_id()

    def trim_log(self, keep: int = 512) -> None:
        """Forget all but the last `keep` entries of `node_log` once it holds four times as many."""
        log = self.node_log
        if len(log) > 4 * keep:
            drop = len(log) - keep
            del log[:drop]
            self.log_from += drop

    def set_reserved(self, node: int, count: int) -> None:
        self.plan.record(self._set_reserved_raw, node, self.reserved[node])
        self._set_reserved_raw(node, count)

    def add_reserved(self, capacity: tuple[tuple[int, int], ...], sign: int) -> None:
        """Add (`sign` 1) or take back (-1) reserved GPUs per (node, GPUs), through the plan (one
        entry for them all)."""
        reserved, reserved_at = self.reserved, self.reserved_at
        free_count, avail = self.free_count, self.index.avail
        before: list[tuple[int, int]] = []
        still = STILL_NODES
        for node, gpus in capacity:
            count = reserved[node]
            before.append((node, count))
            count += sign * gpus
            reserved[node] = count  # (`_set_reserved_raw`, inlined)
            if count:
                reserved_at[node] = count
            elif node in reserved_at:
                del reserved_at[node]
            if not (still and free_count[node] <= count and avail[node] == 0):
                self._move(node)
        self.node_version += 1  # (`_move` skipped where the node offers nothing before and after)
        self.plan.record(self._restore_reserved, before)

    def _restore_reserved(self, before: list[tuple[int, int]]) -> None:
        for node, count in reversed(before):
            self._set_reserved_raw(node, count)

    def drop_reserved(self, capacity: tuple[tuple[int, int], ...]) -> None:
        """Drop the reservations of these nodes outside the plan (at the end of a cycle)."""
        reserved, reserved_at = self.reserved, self.reserved_at
        free_count, avail = self.free_count, self.index.avail
        still = STILL_NODES
        for node, _ in capacity:
            if reserved[node]:
                reserved[node] = 0
                del reserved_at[node]
                if not (still and free_count[node] == 0 and avail[node] == 0):
                    self._move(node)
        self.node_version += 1

    def _set_reserved_raw(self, node: int, count: int) -> None:
        self.reserved[node] = count
        if count:
            self.reserved_at[node] = count
        elif node in self.reserved_at:
            del self.reserved_at[node]
        if STILL_NODES and self.free_count[node] <= count and self.index.avail[node] == 0:
            self.node_version += 1  # (the node offers nothing before and after: nothing to move)
            return
        self._move(node)  # (no mask changed: the free counts stand)

    def set_held(self, node: int, mask: int) -> None:
        before, old = self.base_id, self.held[node]
        self._set_held_raw(node, mask)
        self.plan.record(self._undo_held, node, old, before, self.base_id)

    def _undo_held(self, node: int, mask: int, before: int, after: int) -> None:
        same = self.base_id == after  # as `_undo_hold`
        self._set_held_raw(node, mask)
        if same:
            self.base_id = before

    def _set_held_raw(self, node: int, mask: int) -> None:
        self.held[node] = mask
        self._new_id()
        self._refresh(node)
