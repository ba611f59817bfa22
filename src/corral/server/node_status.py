"""What the API process knows of each node between writes to its row: when it was last heard, its
incarnation, whether it is silent (not responding), lost, unclean, its GPUs' health as last
written and their NVML samples. One object, owned by the `Context`, changed only through its
methods; the agents' routes and the liveness thread (`liveness.py`) read and write it.

Held in memory only (DESIGN.md 6.4): a restarted API process starts with every node unheard."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


class NodeStatus:
    """Per-node liveness of the API process."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.heartbeats: dict[str, float] = {}  # node -> monotonic time of its last heartbeat
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
    def silence(self, node: str, now: float) -> float:
        """Seconds since the node was last heard (since the process started when never)."""
        return now - self.heartbeats.get(node, self.started)

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
        seen = self.heartbeats.get(node)
        return None if seen is None else now - seen
