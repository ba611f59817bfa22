"""A replay runs the cyclic garbage collector rarely, and puts the process's setting back after."""

from __future__ import annotations

import gc
import threading

from corral.sim.gcpause import rare_collections


def test_the_outermost_replay_restores_the_threshold() -> None:
    before = gc.get_threshold()
    with rare_collections():
        assert gc.get_threshold()[0] >= 100_000
        with rare_collections():
            assert gc.get_threshold()[0] >= 100_000
        assert gc.get_threshold()[0] >= 100_000  # the outer replay still runs
    assert gc.get_threshold() == before


def test_replays_in_threads_restore_the_threshold() -> None:
    before = gc.get_threshold()
    inside = threading.Barrier(2)

    def replay() -> None:
        with rare_collections():
            inside.wait()

    threads = [threading.Thread(target=replay) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gc.get_threshold() == before
