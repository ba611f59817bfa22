"""GPU use and pending demand over time (the dashboard's charts): averages per bucket, waits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from corral.server.series import Interval, Window, averages, choose_window, levels_at, waits


def test_averages_are_gpu_seconds_per_bucket() -> None:
    window = Window(since=0.0, step=10.0, points=4)  # [0, 40)
    out = averages(
        [
            Interval("a", 5.0, 25.0, 2),  # half of bucket 0, all of 1, half of 2
            Interval("a", 0.0, 100.0, 1),  # every bucket, past the window's end
            Interval("b", 30.0, 31.0, 10),  # one second of bucket 3
            Interval("b", -50.0, -1.0, 8),  # before the window
            Interval("c", 12.0, 12.0, 4),  # empty
        ],
        window,
    )
    assert out["a"] == [2.0, 3.0, 2.0, 1.0]
    assert out["b"] == [0.0, 0.0, 0.0, 1.0]
    assert "c" not in out


@pytest.mark.parametrize("start,end", [(0.0, 40.0), (3.3, 37.7), (10.0, 20.0), (39.0, 45.0)])
def test_the_area_under_the_series_is_the_gpu_time(start: float, end: float) -> None:
    window = Window(0.0, 10.0, 4)
    row = averages([Interval("q", start, end, 3)], window)["q"]
    assert sum(row) * window.step == pytest.approx(3 * (min(end, 40.0) - start), abs=0.01)


def _job(state: str, submit: float, end: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(state=state, submit_time=submit, end_time=end)


def _run(start: float, end: float | None, kind: str | None) -> SimpleNamespace:
    return SimpleNamespace(started_at=start, ended_at=end, end_kind=kind)


def test_a_job_waits_until_it_starts_and_again_after_a_preemption() -> None:
    runs = [_run(10.0, 50.0, "preempt"), _run(70.0, None, None)]
    assert waits(_job("running", 0.0), runs, now=100.0) == [(0.0, 10.0), (50.0, 70.0)]
    assert waits(_job("pending", 0.0), [_run(10.0, 50.0, "preempt")], now=100.0) == [
        (0.0, 10.0),
        (50.0, 100.0),
    ]
    assert waits(_job("pending", 0.0), [], now=100.0) == [(0.0, 100.0)]
    assert waits(_job("cancelled", 0.0, end=30.0), [], now=100.0) == [(0.0, 30.0)]
    assert waits(_job("finished", 0.0, end=60.0), [_run(5.0, 60.0, "finish")], now=100.0) == [(0.0, 5.0)]


def test_levels_now_count_what_holds_at_that_time() -> None:
    spans = [Interval("a", 0.0, 100.0, 2), Interval("a", 0.0, 50.0, 4), Interval("b", 90.0, 100.0, 1)]
    assert levels_at(spans, 100.0) == {"a": 2, "b": 1}


def test_windows_default_to_the_last_hour_in_equal_buckets() -> None:
    window = choose_window(None, None, 120, now=7200.0)
    assert (window.since, window.step, window.points, window.until) == (3600.0, 30.0, 120, 7200.0)
    tiny = choose_window(100.0, 101.0, 10, now=500.0)
    assert tiny.step == 1.0 and tiny.until == 101.0
