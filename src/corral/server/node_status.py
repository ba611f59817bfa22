"""What the API process knows of each node between writes to its row: when it was last heard, its
incarnation, whether it is silent (not responding), lost, unclean, its GPUs' health as last
written and their NVML samples. One object, owned by the `Context`, changed only through its
methods; the agents' routes and the liveness thread (`liveness.py`) read and write it.

Held in memory (DESIGN.md 6.4); with several replicas on PostgreSQL the receive times are also
shared through the database in batches (`heard.py`), and the silent and lost sets re-read from it."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


class NodeStatus:
    """Per-node liveness of the API process."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.heartbeats: dict[str, float] = {}  # node -> monotonic time of its last heartbeat
        # node -> when another replica last heard it, on this one's monotonic clock (`heard.py`)
        self.elsewhere: dict[str, float] = {}
        self.incarnations: dict[str, int] = {}
        # node -> its GPUs' last utilisation and memory samples (NVML nodes only), from heartbeats
        self.gpu_samples: dict[str, list[dict[str, Any]]] = {}
        self.lost: set[str] = set()  # nodes declared lost whose agents have not registered again
        self.gpu_health: dict[str, dict[str, str]] = {}  # node -> unhealthy GPUs as last written
        self.unclean: set[str] = set()  # nodes drained because processes survived a kill
        self.silent: set[str] = set()  # registered nodes marked not responding (no new work)

    # ---- what the agents' routes learn ----------------------------------------------------------
    def heard(self, node: str) -> None:
        self.heartbeats[node] = time.monotonic()

    def joined(self, node: str, incarnation: int, unhealthy: dict[str, str], lost: bool) -> None:
        """A registration was written: heard now, answering, with its GPUs' health as sent."""
        self.incarnations[node] = incarnation
        self.heard(node)
        self.silent.discard(node)
        self.gpu_health[node] = dict(unhealthy)
        if not lost:
            self.lost.discard(node)

    def answering(self, node: str) -> None:
        """A silent node answers again (its row was marked responding)."""
        self.silent.discard(node)

    def sampled(self, node: str, samples: list[dict[str, Any]]) -> None:
        self.gpu_samples[node] = samples

    def health_written(self, node: str, unhealthy: dict[str, str]) -> None:
        self.gpu_health[node] = dict(unhealthy)

    def set_unclean(self, node: str, unclean: bool) -> None:
        if unclean:
            self.unclean.add(node)
        else:
            self.unclean.discard(node)

    # ---- what the liveness thread decides -------------------------------------------------------
    def heard_elsewhere(self, times: dict[str, float]) -> None:
        self.elsewhere = times

    def last_heard(self, node: str) -> float | None:
        """When the node was last heard, by this replica or by another (monotonic); None: never."""
        here, there = self.heartbeats.get(node), self.elsewhere.get(node)
        if here is None or there is None:
            return here if there is None else there
        return max(here, there)

    def silence(self, node: str, now: float) -> float:
        """Seconds since the node was last heard by any replica (since the process started when never)."""
        heard = self.last_heard(node)
        return now - (self.started if heard is None else max(heard, self.started))

    def sync(self, silent: set[str], lost: set[str]) -> None:
        """What the database says (another replica may have marked a node): nodes not responding,
        so that a heartbeat here sets them back; nodes lost, whose agents must register again."""
        self.silent = set(silent)
        for node in lost - self.lost:
            self.declared_lost(node)

    def went_silent(self, nodes: Iterable[str]) -> None:
        self.silent.update(nodes)

    def declared_lost(self, node: str) -> None:
        self.lost.add(node)
        self.incarnations.pop(node, None)

    # ---- questions ------------------------------------------------------------------------------
    def health(self, node: str) -> dict[str, str]:
        return self.gpu_health.get(node, {})

    def samples(self, node: str) -> list[dict[str, Any]]:
        return self.gpu_samples.get(node, [])

    def heartbeat_age(self, node: str, now: float) -> float | None:
        seen = self.last_heard(node)
        return None if seen is None else now - seen
