"""The event log of DESIGN.md 4.6 as the simulator writes it: numbered dicts, to sinks.

`seq` increases strictly and `t` never decreases; the simulator emits endings before
submissions before starts at equal `t`, so a log replays on its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from corral.core.eventshape import cluster_line, placement_json
from corral.core.model import NodeSpec, PriorityClass, QueueSpec

__all__ = ["EventLog", "JsonLinesSink", "placement_json"]

Sink = Callable[[dict[str, Any]], None]


class EventLog:
    """Assigns `seq`, checks `t`, and hands each event to every sink."""

    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks = list(sinks)
        self.seq = 0
        self.t = 0.0

    def emit(self, event: dict[str, Any]) -> None:
        self.seq += 1
        event["seq"] = self.seq
        t = event.get("t")
        if t is not None:
            if t < self.t:
                raise ValueError(f"event {event['event']} at t={t} is earlier than t={self.t}")
            self.t = t
        for sink in self.sinks:
            sink(event)

    def cluster(
        self,
        levels: Iterable[str],
        nodes: Iterable[NodeSpec],
        queues: Iterable[QueueSpec],
        classes: Iterable[PriorityClass],
    ) -> None:
        self.emit(cluster_line(levels, nodes, queues, classes))


class JsonLinesSink:
    """Writes each event as one line of JSON (`--events-out`)."""

    def __init__(self, path: str | Path) -> None:
        self._file: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._dumps = json.JSONEncoder(separators=(",", ":")).encode

    def __call__(self, event: dict[str, Any]) -> None:
        self._file.write(self._dumps(event))
        self._file.write("\n")

    def close(self) -> None:
        self._file.close()
