"""The plan: an undo log over the cluster state, where a checkpoint is an index.

Every tentative change of a cycle goes through it; `rollback(checkpoint)` pops back to the
checkpoint, applying the recorded inverses in reverse order (Volcano's statement, KAI's
`checkpoint = len(operations)`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Plan:
    """An undo log: `record` an inverse after each change, `rollback` to undo back to a checkpoint."""

    __slots__ = ("_log",)

    def __init__(self) -> None:
        self._log: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def record(self, undo: Callable[..., Any], *args: Any) -> None:
        self._log.append((undo, args))

    def checkpoint(self) -> int:
        return len(self._log)

    def rollback(self, checkpoint: int = 0) -> None:
        log = self._log
        while len(log) > checkpoint:
            undo, args = log.pop()
            undo(*args)

    def commit(self) -> None:
        """Keep every change made so far; they can no longer be rolled back."""
        self._log.clear()

    def __len__(self) -> int:
        return len(self._log)
