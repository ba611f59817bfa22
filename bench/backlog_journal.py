"""The journal's side of `server_bench.py --only backlog` (bench/server_backlog.py): per attempt
the fleet ended, the time from its exit report's commit to the next start on its GPUs."""

from __future__ import annotations

import json
from typing import Any

ENDINGS = ("finish", "fail", "restart", "preempt", "lost", "cancel")


def journal(url: str) -> list[tuple[str, float, dict[str, Any]]]:
    """Every start, exit report, ending and preemption in the server's journal, in order."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    kinds = ", ".join(f"'{k}'" for k in ("start", "x.exit", "preempting", *ENDINGS))
    query = text(f"SELECT kind, t, body FROM events WHERE kind IN ({kinds}) ORDER BY seq")
    try:
        with engine.connect() as conn:
            rows = conn.execute(query).all()
    finally:
        engine.dispose()
    return [(kind, t, json.loads(body)) for kind, t, body in rows]


def next_starts(
    rows: list[tuple[str, float, dict[str, Any]]],
    ended: list[dict[str, Any]],
    received: dict[tuple[str, int], float],
) -> dict[str, Any]:
    """Per attempt the fleet ended: exit committed -> the first later start on one of its GPUs
    (journal time, and the agent's receipt), and -> its ending."""
    from bench.server_probes import percentile

    mine = {(e["job"], e["attempt"]) for e in ended}
    gpus: dict[tuple[str, int], set[tuple[str, int]]] = {}
    waiting: dict[tuple[str, int], tuple[float, set[tuple[str, int]]]] = {}  # ended attempt -> exit t, GPUs
    journal_s, agent_s, to_cycle, preempts = [], [], [], 0
    for kind, t, body in rows:
        key = (body.get("job"), body.get("attempt"))
        if kind == "start":
            held = {(p["node"], g) for p in body["placement"] for g in p["gpus"]}
            gpus[key] = held
            for old, (t_exit, freed) in list(waiting.items()):
                if freed & held:
                    journal_s.append(t - t_exit)
                    if key in received:
                        agent_s.append(received[key] - t_exit)
                    del waiting[old]
        elif kind == "x.exit" and key in mine:
            waiting[key] = (t, gpus.get(key, set()))
            mine.discard(key)
        elif kind in ENDINGS and key in waiting:
            to_cycle.append(t - waiting[key][0])
        elif kind == "preempting":
            preempts += 1
    pct = {}
    for name, values in (("next_start", journal_s), ("agent_start", agent_s), ("exit_to_cycle", to_cycle)):
        for p in (50, 99):
            pct[f"{name}_p{p}_s"] = percentile(values, p)
        pct[f"{name}_max_s"] = max(values, default=float("nan"))
    return {
        **pct,
        "no_next_start": len(waiting) + len(mine),
        "preemptions": preempts,
        "matched": len(journal_s),
    }
