"""What each local worker of a start order runs with (DESIGN.md 4.3), as a pure function."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PASSED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM"})  # and every LC_*
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Worker:
    """One process to launch: its rank (the replica index), argv and the variables Corral sets."""

    rank: int
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def hostfile_lines(order: dict[str, Any]) -> list[str]:
    """One line per node of the attempt, in rank order: `address slots=N` (DeepSpeed, MPI)."""
    addresses: dict[str, str] = order.get("addresses") or {}
    per_node = _nodes(order["placement"])
    lines = []
    for node, replicas in per_node.items():
        gpus = sum(len(order["placement"][i]["gpus"]) for i in replicas)
        lines.append(f"{addresses.get(node) or node} slots={gpus or len(replicas)}")
    return lines


def _nodes(placement: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each node of the placement (in order of its first replica) with its replica indices."""
    out: dict[str, list[int]] = {}
    for i, replica in enumerate(placement):
        out.setdefault(replica["node"], []).append(i)
    return out


NCCL_NAMES = {"ib_hcas": "NCCL_IB_HCA", "ib_hca": "NCCL_IB_HCA", "socket_ifname": "NCCL_SOCKET_IFNAME"}


def nccl_env(network: dict[str, Any]) -> dict[str, str]:
    """The node's `network:` settings (cluster file or registration) as NCCL variables:
    `nccl_socket_ifname: eth0` is `NCCL_SOCKET_IFNAME=eth0`, `ib_hcas: [mlx5_0, mlx5_1]` is
    `NCCL_IB_HCA=mlx5_0,mlx5_1`; lists are joined with commas, booleans are 1 or 0."""
    out: dict[str, str] = {}
    for key, value in network.items():
        name = str(key)
        name = NCCL_NAMES.get(name.lower(), name.upper() if name.lower().startswith("nccl_") else "")
        if not name:
            continue
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, list | tuple):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        out[name] = text
    return out


def workers(
    order: dict[str, Any], node: str, checkpoint_dir: Path, hostfile: Path, control_dir: Path | None = None
) -> list[Worker]:
    """The processes of `order` that run on `node`: one per local replica (`per_gpu`) or one for the
    node (`per_node`), each with the environment of DESIGN.md 4.3 on top of the job's `env`."""
    spec: dict[str, Any] = order["spec"]
    placement: list[dict[str, Any]] = order["placement"]
    per_node = _nodes(placement)
    if node not in per_node:
        return []
    addresses: dict[str, str] = order.get("addresses") or {}
    first = placement[0]["node"] if placement else node
    node_gpus = {n: sum(len(placement[i]["gpus"]) for i in reps) for n, reps in per_node.items()}
    common = {
        "WORLD_SIZE": str(len(placement)),
        "MASTER_ADDR": addresses.get(first) or "127.0.0.1",
        "MASTER_PORT": str(order.get("master_port") or 29500),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "TORCHELASTIC_RUN_ID": f"{order['job']}-{order['attempt']}",
        "CORRAL_JOB_ID": str(order["job"]),
        "CORRAL_ATTEMPT": str(order["attempt"]),
        "CORRAL_NUM_NODES": str(len(per_node)),
        "CORRAL_HOSTFILE": str(hostfile),
        "CORRAL_CHECKPOINT_DIR": str(checkpoint_dir),
        "CORRAL_CHECKPOINT_SIGNAL": str((spec.get("checkpoint") or {}).get("signal") or "SIGTERM"),
        **nccl_env((order.get("networks") or {}).get(node) or {}),
    }
    if control_dir is not None:
        common["CORRAL_CONTROL_DIR"] = str(control_dir)
    if len(set(node_gpus.values())) == 1:
        common["CORRAL_GPUS_PER_NODE"] = str(next(iter(node_gpus.values())))
    node_rank = list(per_node).index(node)
    base = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    argv = [str(a) for a in spec["command"]]
    local = per_node[node]
    if spec.get("launch", "per_gpu") == "per_node":
        rank = local[0]
        gpus = [g for i in local for g in placement[i]["gpus"]]
        env = {
            **base,
            **common,
            "RANK": str(rank),
            "NODE_RANK": str(rank),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        }
        return [Worker(rank, argv, env)]
    out = []
    for local_rank, rank in enumerate(local):
        env = {
            **base,
            **common,
            "RANK": str(rank),
            "NODE_RANK": str(node_rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(len(local)),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in placement[rank]["gpus"]),
        }
        out.append(Worker(rank, argv, env))
    return out


def base_env(
    agent_env: Mapping[str, str], home: str, user: str, shell: str = "", extra: Iterable[str] = ()
) -> dict[str, str]:
    """What a worker starts from, below the job's `env` and the contract's variables: the agent's
    `PATH`, `LANG`, `LANGUAGE`, `TZ`, `TERM` and `LC_*` (plus the names an operator passed with
    `corral agent --pass-env`), and `HOME`, `USER`, `LOGNAME`, `SHELL` of the user the job runs as.
    Nothing else of the agent's environment (its tokens, its secrets) reaches a job."""
    allowed = PASSED | set(extra)
    out = {k: v for k, v in agent_env.items() if k in allowed or k.startswith("LC_")}
    out.setdefault("PATH", DEFAULT_PATH)
    out.update(HOME=home, USER=user, LOGNAME=user, SHELL=shell or "/bin/sh")
    return out
