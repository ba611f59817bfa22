"""Which journal lines become webhook deliveries, of what kind, for which sinks (no server)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from corral.config.cluster_file import parse_cluster_config
from corral.server.notify_ingest import deliveries

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
