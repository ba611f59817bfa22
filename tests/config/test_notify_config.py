"""The cluster file's `notify:` (sinks under an admin-set allowlist) and the job spec's `notify`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.cli.submit_spec import SubmitFlags, apply_flags
from corral.config.cluster_file import parse_cluster_config
from corral.config.job_spec import parse_job_spec
from corral.config.notify_config import is_allowed
from corral.core.errors import ConfigError

ALLOW = ["https://hooks.example.com/corral/", "http://127.0.0.1:9000/"]


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/corral/ops",
        "https://HOOKS.example.com:443/corral/a/b",
        "https://hooks.example.com/corral",
        "http://127.0.0.1:9000/anything",
    ],
)
def test_urls_under_an_allowed_prefix(url: str) -> None:
    assert is_allowed(url, ALLOW)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/corralx",  # a prefix of the path, not of its segments
        "https://hooks.example.com/other",
        "http://hooks.example.com/corral/ops",  # another scheme
        "https://hooks.example.com:8443/corral/ops",  # another port
        "https://hooks.example.com.evil.net/corral/ops",
        "https://hooks.example.com@evil.net/corral/ops",  # credentials: the host is evil.net
        "https://user:pw@hooks.example.com/corral/ops",
        "https://hooks.example.com/corral/../admin",
        "https://hooks.example.com/corral/%2e%2e/admin",
        "https://hooks.example.com/corral/ops?to=http://169.254.169.254/",
        "http://127.0.0.1:9001/",
        "http://localhost:9000/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:9000/",
        "",
    ],
)
def test_urls_outside_the_allowlist(url: str) -> None:
    assert not is_allowed(url, ALLOW)


def _cluster(notify: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodes": [{"name": "n1", "gpus": 8}],
        "queues": [{"name": "research"}, {"name": "prod"}],
        "notify": notify,
    }


def test_sinks_are_checked_against_the_allowlist_at_config_time(tmp_path: Path) -> None:
    sink = {"name": "ops", "url": "https://hooks.example.com/corral/ops", "secret_env": "HOOK_SECRET"}
    cfg = parse_cluster_config(_cluster({"allow": ALLOW, "sinks": [{**sink, "queues": ["prod"]}]}))
    assert [s.name for s in cfg.notify.sinks_for("prod")] == ["ops"] and cfg.notify.sinks_for(
        "research"
    ) == ()
    with pytest.raises(ConfigError) as outside:
        parse_cluster_config(
            _cluster({"allow": ALLOW, "sinks": [{**sink, "url": "http://10.0.0.5/x"}]}), "c.yaml"
        )
    text = str(outside.value)
    assert "notify.sinks[0].url" in text and "http://10.0.0.5/x is not under any URL of notify.allow" in text
    assert "have an admin add the prefix to notify.allow" in text
    with pytest.raises(ConfigError, match=r"`notify\.allow` is empty"):
        parse_cluster_config(_cluster({"sinks": [sink]}))
    with pytest.raises(ConfigError, match="exactly one of secret_file and secret_env"):
        parse_cluster_config(_cluster({"allow": ALLOW, "sinks": [{"name": "a", "url": sink["url"]}]}))
    with pytest.raises(ConfigError, match="unknown queue 'nope'"):
        parse_cluster_config(_cluster({"allow": ALLOW, "sinks": [{**sink, "queues": ["nope"]}]}))
    with pytest.raises(ConfigError, match="is not an http"):
        parse_cluster_config(_cluster({"allow": ["ftp://x/"], "sinks": []}))
    with pytest.raises(ConfigError, match="declared twice"):
        parse_cluster_config(_cluster({"allow": ALLOW, "sinks": [sink, sink]}))
    with pytest.raises(ConfigError, match="unknown field `sinkz`"):
        parse_cluster_config(_cluster({"allow": ALLOW, "sinkz": []}))
    assert parse_cluster_config({"nodes": [{"name": "n1", "gpus": 1}]}).notify.sinks == ()


def test_the_job_spec_notify_field_and_the_submit_flag() -> None:
    assert parse_job_spec({"command": ["x"], "notify": ["end", "FAIL", "end"]}).notify == ("end", "fail")
    assert parse_job_spec({"command": ["x"]}).notify == ()
    with pytest.raises(ConfigError) as bad:
        parse_job_spec({"command": ["x"], "notify": ["end", "finish"]})
    assert "notify: unknown notification event 'finish'" in str(bad.value)
    assert "start, end, fail, preempt, restart" in str(bad.value)
    with pytest.raises(ConfigError, match="not a list of events"):
        parse_job_spec({"command": ["x"], "notify": 3})
    spec = apply_flags({}, SubmitFlags(notify="end, fail,preempt"))
    assert spec["notify"] == ["end", "fail", "preempt"]
    assert parse_job_spec(spec).notify == ("end", "fail", "preempt")
