"""`server_bench.py --only array`: one job array of 10,000 tasks through a real `corral server`.

One node agent (dgx01, 8 GPUs) is registered and long-polls its orders. Figures: the time from
sending the array's one POST until its 201 (the whole array committed: 10,000 job rows, their
`submit` events and the array row in one transaction); from sending it until the agent receives
its first start order; and the scheduler's cycle time (its own histogram,
`corral_scheduling_cycle_seconds`, read from `/metrics`) while 10,000 pending tasks of the array
wait, measured over cycles that each start one task after one ends. The same cycle figure is
taken for 10,000 ordinary jobs of the same shape, submitted one by one, for comparison.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

INFO = [
    ("tasks", "tasks in the array"),
    ("commit_s", "array POST -> 201 (one commit) s"),
    ("first_start_s", "array POST -> first start order at the agent s"),
    ("cycle_ms", "scheduler cycle ms, every task of the array pending"),
    ("cycles", "cycles measured"),
    ("jobs_submit_s", "as many ordinary jobs, submitted one by one s"),
    ("jobs_cycle_ms", "scheduler cycle ms, those ordinary jobs pending"),
]


def _histogram(http: Any) -> tuple[float, float]:
    status, text = http.call_text("GET", "/metrics")
    assert status == 200, text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("corral_scheduling_cycle_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("corral_scheduling_cycle_seconds_count"):
            count = float(line.split()[-1])
    return total, count


def run(server: Any, http_cls: Any, tasks: int, rounds: int) -> dict[str, Any]:
    spec = {"name": "bench", "queue": "research", "gpus_per_replica": 1, "command": ["python", "x.py"]}
    agent_token = server.token("agent-dgx01", "agent")
    user, agent, poller = (http_cls(server.port, t) for t in (server.admin_token, agent_token, agent_token))
    node = {"node": "dgx01", "gpus": 8, "gpu_model": "H100-80GB"}
    status, reg = agent.call("POST", "/v1/agents/register", node)
    assert status == 200, reg
    report = {"incarnation": reg["incarnation"]}
    orders: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
    stop = threading.Event()

    def poll() -> None:
        after = 0
        while not stop.is_set():
            try:
                _, body = poller.call("GET", f"/v1/agents/dgx01/assignments?after={after}&wait=5")
            except OSError:
                return
            now = time.monotonic()
            for order in body["orders"]:
                orders.put((now, order))
                after = order["seq"]

    threading.Thread(target=poll, daemon=True).start()
    time.sleep(0.3)
    sent = time.monotonic()
    status, array = user.call("POST", "/v1/jobs", {**spec, "array": f"0-{tasks - 1}"})
    out: dict[str, Any] = {"tasks": tasks, "commit_s": time.monotonic() - sent}
    assert status == 201, array
    seen, order = orders.get(timeout=120)
    out["first_start_s"] = seen - sent
    out["cycle_ms"], out["cycles"] = _cycles(user, agent, report, orders, [order], rounds)
    # the same backlog as ordinary jobs: cancel the array, submit one by one
    user.call("POST", f"/v1/jobs/{array['id']}/cancel")
    _stop_all(orders, agent, report)
    t0 = time.monotonic()
    for _ in range(tasks):
        status, _job = user.call("POST", "/v1/jobs", spec)
        assert status == 201
    out["jobs_submit_s"] = time.monotonic() - t0
    first = _wait_start(orders)
    out["jobs_cycle_ms"], _ = _cycles(user, agent, report, orders, [first], rounds)
    stop.set()
    return out


def _wait_start(orders: queue.Queue[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    while True:
        _, order = orders.get(timeout=120)
        if order["kind"] == "start":
            return order


def _stop_all(orders: Any, agent: Any, report: dict[str, Any], quiet: float = 2.0) -> None:
    """Carry out the stop orders of a cancel: each stopped task exits."""
    while True:
        try:
            _, order = orders.get(timeout=quiet)
        except queue.Empty:
            return
        if order["kind"] == "stop":
            body = dict(report, job=order["job"], attempt=order["attempt"], status="exited", exit_code=143)
            agent.call("POST", "/v1/agents/dgx01/reports", body)


def _cycles(user: Any, agent: Any, report: dict[str, Any], orders: Any, started: list[dict[str, Any]],
            rounds: int) -> tuple[float, int]:  # fmt: skip
    """End one running task per round and wait for the next start; the mean cycle in ms."""
    time.sleep(1.0)  # the first starts are committed
    while True:
        try:
            _, order = orders.get_nowait()
        except queue.Empty:
            break
        if order["kind"] == "start":
            started.append(order)
    total0, count0 = _histogram(user)
    for _ in range(rounds):
        order = started.pop(0)
        body = dict(report, job=order["job"], attempt=order["attempt"], status="exited", exit_code=0)
        agent.call("POST", "/v1/agents/dgx01/reports", body)
        started.append(_wait_start(orders))
    time.sleep(0.5)
    total1, count1 = _histogram(user)
    cycles = int(count1 - count0)
    return (1000 * (total1 - total0) / cycles if cycles else float("nan")), cycles


def bench_array(
    args: Any, tmp: Path, server_cls: Any, http_cls: Any, lab: Path, database: Any
) -> dict[str, Any]:
    tasks, rounds = (1000, 10) if args.quick else (10_000, 30)
    with database(args.database_url, tmp) as url:
        server = server_cls(url, tmp / "data", lab)
        server.start()
        try:
            return run(server, http_cls, tasks, rounds)
        finally:
            server.stop()
