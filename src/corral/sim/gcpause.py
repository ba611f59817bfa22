"""Replays run the cyclic garbage collector rarely (`rare_collections`)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_gc_lock = threading.Lock()
_gc_users = 0  # replays running now (nested or in threads): the outermost sets and restores
_gc_saved: tuple[int, int, int] = (700, 10, 10)


@contextmanager
def rare_collections() -> Iterator[None]:
    """Run the cyclic garbage collector rarely: a replay allocates millions of objects that die
    young or live for the whole run, and almost no reference cycles (collecting every 700 net
    allocations, the default, costs several per cent of a replay)."""
    global _gc_users, _gc_saved
    with _gc_lock:
        if _gc_users == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(max(_gc_saved[0], 100_000), _gc_saved[1], _gc_saved[2])
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                gc.set_threshold(*_gc_saved)
