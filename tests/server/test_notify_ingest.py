"""Which journal lines become webhook deliveries, of what kind, for which sinks (no server)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import create_engine, insert, select

from corral.config.cluster_file import parse_cluster_config
from corral.server.notify_ingest import deliveries
from corral.store import schema

ALLOW = ["https://hooks.example.com/corral/"]


def test_which_journal_lines_make_deliveries_and_of_what_kind() -> None:
    sink = {
        "name": "ops",
        "url": "https://hooks.example.com/corral/ops",
        "secret_env": "S",
        "queues": ["prod"],
    }
    cluster = {"nodes": [{"name": "n1", "gpus": 8}], "queues": [{"name": "research"}, {"name": "prod"}]}
    notify = parse_cluster_config({**cluster, "notify": {"allow": ALLOW, "sinks": [sink]}}).notify

    def kinds(event: str, subscribed: list[str], queue: str = "prod") -> list[tuple[str, str]]:
        line = SimpleNamespace(seq=7, kind=event, body=json.dumps({"seq": 7, "event": event, "job": "j1"}))
        job = SimpleNamespace(
            id="j1",
            name="n",
            queue=queue,
            user="ada",
            team="t",
            request=json.dumps({"notify": subscribed}),
        )
        rows = deliveries(line, job, notify, "lab", "abcd", 1.0)
        return [(r["id"], r["kind"]) for r in rows]

    assert kinds("fail", ["end", "fail"]) == [("abcd-7-ops", "fail")]  # one delivery, the specific kind
    assert kinds("fail", ["end"]) == [("abcd-7-ops", "end")]
    assert kinds("finish", ["fail"]) == []
    assert kinds("preempt", ["preempt"]) == kinds("lost", ["preempt"]) == [("abcd-7-ops", "preempt")]
    assert kinds("restart", ["restart"]) == [("abcd-7-ops", "restart")]
    assert kinds("cancel", ["end"]) == [("abcd-7-ops", "end")]
    assert kinds("start", ["start"], queue="research") == []  # the sink serves prod only
    assert kinds("start", []) == []


def test_old_settled_deliveries_are_pruned_and_waiting_ones_kept(tmp_path: Path) -> None:
    from corral.server.notify import prune

    engine = create_engine(f"sqlite:///{tmp_path / 'n.db'}")
    schema.metadata.create_all(engine)
    base = {
        "sink": "ops",
        "event_seq": 1,
        "job": "j1",
        "kind": "end",
        "body": "{}",
        "attempts": 1,
        "next_at": 0.0,
    }
    rows = [
        {**base, "id": f"{state}-{created}", "state": state, "created_at": created}
        for state in ("pending", "delivered", "failed", "dropped")
        for created in (10.0, 1000.0)
    ]
    with engine.begin() as conn:
        conn.execute(insert(schema.notify_deliveries), rows)
        assert prune(conn, 500.0) == 3
        left = sorted(r[0] for r in conn.execute(select(schema.notify_deliveries.c.id)))
    assert left == ["delivered-1000.0", "dropped-1000.0", "failed-1000.0", "pending-10.0", "pending-1000.0"]
    engine.dispose()
