"""What each worker runs with (DESIGN.md 4.3), from start orders; and the master port the server
gives each attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.agent.launch import DEFAULT_PATH, base_env, hostfile_lines, workers
from corral.agent.runner import exit_code_of, signal_number
from tests.server.harness import FakeAgent, Server, wait_for

CKPT, HOSTS = Path("/ckpt/j7"), Path("/run/j7/hostfile")


def order(launch: str, placement: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "start",
        "job": "j7",
        "attempt": 2,
        "placement": placement,
        "addresses": {"a": "10.0.0.1", "b": "10.0.0.2"},
        "master_port": 29501,
        "spec": {"command": ["python", "train.py"], "env": {"X": "1", "RANK": "spec"}, "launch": launch},
    }


def test_per_gpu_ranks_group_by_node_in_rank_order() -> None:
    o = order("per_gpu", [{"node": "a", "gpus": [0]}, {"node": "a", "gpus": [1]}, {"node": "b", "gpus": [3]}])
    on_a, on_b = workers(o, "a", CKPT, HOSTS), workers(o, "b", CKPT, HOSTS)
    assert [w.rank for w in on_a] == [0, 1] and [w.rank for w in on_b] == [2]
    b = on_b[0].env
    assert (b["RANK"], b["LOCAL_RANK"], b["LOCAL_WORLD_SIZE"], b["NODE_RANK"], b["WORLD_SIZE"]) == (
        "2",
        "0",
        "1",
        "1",
        "3",
    )
    assert b["MASTER_ADDR"] == "10.0.0.1" and b["MASTER_PORT"] == "29501"
    assert b["CUDA_VISIBLE_DEVICES"] == "3" and b["TORCHELASTIC_RUN_ID"] == "j7-2"
    assert b["CORRAL_NUM_NODES"] == "2" and "CORRAL_GPUS_PER_NODE" not in b  # 2 GPUs on a, 1 on b
    assert b["X"] == "1" and b["RANK"] == "2"  # Corral's variables win over the spec's env
    assert on_a[1].env["LOCAL_RANK"] == "1" and on_a[1].argv == ["python", "train.py"]
    assert hostfile_lines(o) == ["10.0.0.1 slots=2", "10.0.0.2 slots=1"]
    assert workers(o, "c", CKPT, HOSTS) == []


def test_per_node_is_one_process_per_node_and_cpu_only_replicas_see_no_gpu() -> None:
    o = order("per_node", [{"node": "a", "gpus": [0, 1]}, {"node": "b", "gpus": [0, 1]}])
    (w,) = workers(o, "b", CKPT, HOSTS)
    assert (w.rank, w.env["NODE_RANK"], w.env["CORRAL_GPUS_PER_NODE"], w.env["CUDA_VISIBLE_DEVICES"]) == (
        1,
        "1",
        "2",
        "0,1",
    )
    cpu = order("per_gpu", [{"node": "a", "gpus": []}])
    assert workers(cpu, "a", CKPT, HOSTS)[0].env["CUDA_VISIBLE_DEVICES"] == ""


def test_exit_codes_and_signals() -> None:
    assert exit_code_of(3) == 3 and exit_code_of(-9) == 137
    assert signal_number("SIGUSR1") == 10 and signal_number("term") == 15 and signal_number(None) == 15


def test_live_attempts_on_one_node_get_distinct_master_ports(server: Server) -> None:
    fake = FakeAgent(server, "dgx01", 8, "H100-80GB", address="10.1.2.3")
    fake.register()
    with server.client() as c:
        for _ in range(2):
            spec = {"queue": "research", "gpus_per_replica": 2, "command": ["true"]}
            assert c.post("/v1/jobs", json=spec).status_code == 201
    starts: list[dict[str, Any]] = []
    wait_for(lambda: starts.extend(fake.orders(wait=1)) or len(starts) >= 2, timeout=15)
    assert sorted(o["master_port"] for o in starts) == [29500, 29501]
    assert all(o["addresses"] == {"dgx01": "10.1.2.3"} for o in starts)
    fake.close()


def test_a_worker_starts_from_an_allowlist_of_the_agents_environment() -> None:
    agent = {
        "PATH": "/opt/cuda/bin:/usr/bin",
        "LANG": "en_GB.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "HOME": "/root",
        "USER": "root",
        "CORRAL_AGENT_TOKEN": "crl_secret",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "LD_PRELOAD": "/root/hook.so",
        "PYTHONPATH": "/root/lib",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    }
    assert base_env(agent, "/home/ada", "ada", "/bin/bash") == {
        "PATH": "/opt/cuda/bin:/usr/bin",
        "LANG": "en_GB.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "HOME": "/home/ada",
        "USER": "ada",
        "LOGNAME": "ada",
        "SHELL": "/bin/bash",
    }
    passed = base_env(agent, "/home/ada", "ada", extra=["LD_LIBRARY_PATH"])  # `--pass-env`
    assert passed["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64" and passed["SHELL"] == "/bin/sh"
    assert base_env({}, "/nonexistent", "nobody")["PATH"] == DEFAULT_PATH
