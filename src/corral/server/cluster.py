"""The cluster as the control plane sees it: the active configuration revision and the node rows.

The cluster file is stored as revisions (`config_revisions`); the active one is named by the
`config.active` setting. Nodes live in the `nodes` table: declared ones are inserted when a
revision is applied (state `down` until their agent registers), and agents may add more when
dynamic nodes are allowed (`corral up`). Both the API (to check submissions against the static
capacity) and the scheduler (to schedule) build their view from here.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from sqlalchemy import Connection, insert, select, update

from corral.config.cluster_file import ClusterConfig, parse_cluster_config
from corral.config.notify_config import check_secrets
from corral.core.eventshape import cluster_line
from corral.core.model import NodeName, NodeSpec, NodeState
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.server.config_check import check_live
from corral.store import schema
from corral.store.engine import append_events, dumps

DEFAULT_CLUSTER: dict[str, Any] = {"name": "local", "queues": [{"name": "default"}]}
WAITING_FOR_AGENT = "declared; waiting for its agent to register"


def get_setting(conn: Connection, key: str, default: str | None = None) -> str | None:
    row = conn.execute(select(schema.settings.c.value).where(schema.settings.c.key == key)).first()
    return row[0] if row is not None else default


def put_setting(conn: Connection, key: str, value: str) -> None:
    t = schema.settings
    if conn.execute(update(t).where(t.c.key == key).values(value=value)).rowcount == 0:
        conn.execute(insert(t).values(key=key, value=value))


@dataclass
class ClusterModel:
    """The active configuration and every node row, with the scheduling state built from them."""

    revision: int
    body: dict[str, Any]
    config: ClusterConfig  # nodes: every node row, whatever its state
    node_states: dict[str, NodeState]
    node_rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the last revision the scheduler refused (`config.refused`: revision, reason, at, in_force)
    refused: dict[str, Any] | None = None

    def build_state(self) -> ClusterState:
        state = ClusterState(self.config.topology, self.config.queues, self.config.priority_classes)
        for spec in self.config.nodes:
            state.add_node(spec, self.node_states.get(spec.name, NodeState.DOWN))
        for name, row in self.node_rows.items():
            for gpu in json.loads(row["unhealthy"]) if row["unhealthy"] != "{}" else ():
                state.set_gpu_health(NodeName(name), int(gpu), False)
        return state

    @property
    def default_queue(self) -> str:
        return self.config.queues[0].name


@functools.lru_cache(maxsize=4096)
def _nvlink(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(g) for g in json.loads(text))


@functools.lru_cache(maxsize=4096)
def _mapping(text: str) -> MappingProxyType[str, Any]:
    """Labels and network settings, parsed once per distinct text (thousands of nodes share a few)."""
    return MappingProxyType(json.loads(text))


def node_spec_of(row: Mapping[str, Any] | Any) -> NodeSpec:
    nvlink = _nvlink(row["nvlink"])
    return NodeSpec(
        name=NodeName(row["name"]),
        gpus=row["gpus"],
        gpu_model=row["gpu_model"],
        gpu_memory_gib=row["gpu_memory_gib"],
        cpus=row["cpus"],
        memory_gib=row["memory_gib"],
        labels=_mapping(row["labels"]),
        nvlink=nvlink,
        address=row["address"],
        network=_mapping(row["network"]),
    )


def node_values(spec: NodeSpec) -> dict[str, Any]:
    return {
        "gpus": spec.gpus,
        "gpu_model": spec.gpu_model,
        "gpu_memory_gib": spec.gpu_memory_gib,
        "cpus": spec.cpus,
        "memory_gib": spec.memory_gib,
        "labels": dumps(dict(spec.labels)),
        "nvlink": dumps([list(g) for g in spec.nvlink]),
        "network": dumps(dict(spec.network)),
        "address": spec.address,
    }


def scheduling_state(row: Mapping[Any, Any]) -> NodeState:
    """The state the scheduler sees: an `up` node that is not responding takes no new work, like a
    cordoned one (its running work stays until the node is declared lost)."""
    state = NodeState(row["state"])
    if state is NodeState.UP and not row.get("responding", True):
        return NodeState.CORDONED
    return state


def load_cluster(conn: Connection, revision: int | None = None) -> ClusterModel:
    """The active revision (or `revision`) and the node rows; a database without a revision gets
    the default one. Raises ConfigError when the stored document is not a valid cluster file."""
    active = get_setting(conn, "config.active") if revision is None else str(revision)
    if active is None or active == "0":
        body, revision = DEFAULT_CLUSTER, 0
    else:
        revision = int(active)
        text = conn.execute(
            select(schema.config_revisions.c.body).where(schema.config_revisions.c.id == revision)
        ).scalar_one()
        body = json.loads(text)
    config = parse_cluster_config(body, f"configuration revision {revision}", strict=False)
    rows = {r["name"]: dict(r) for r in conn.execute(select(schema.nodes)).mappings()}
    specs = tuple(node_spec_of(row) for row in rows.values())
    states = {name: scheduling_state(row) for name, row in rows.items()}
    refused = get_setting(conn, "config.refused")
    return ClusterModel(
        revision, body, replace(config, nodes=specs), states, rows, json.loads(refused) if refused else None
    )


def apply_revision(
    conn: Connection,
    body: dict[str, Any],
    author: str,
    comment: str,
    now: float | None = None,
    evidence: str = "",
) -> int:
    """Validate `body` as a cluster file, store it as a new active revision, declare its nodes.

    `now` (default: the wall clock) is the time of the revision and of its `cluster` event.
    `evidence` (JSON, server/evidence.py) is kept with the revision.
    Raises ConfigError (nothing written) when the document is invalid.
    """
    config = parse_cluster_config(body, "cluster configuration")
    check_secrets(config.notify, "cluster configuration")  # webhook secrets this process can read
    if "policy" in body or "policy_args" in body:  # a policy kept with the configuration: check it now
        load_policy(str(body.get("policy", "default")), body.get("policy_args"))
    check_live(conn, config)  # a queue or class that live jobs use cannot disappear
    now = time.time() if now is None else now
    revision = conn.execute(
        insert(schema.config_revisions).values(
            created_at=now, author=author, comment=comment, body=dumps(body), evidence=evidence
        )
    ).inserted_primary_key
    assert revision is not None
    rev_id = int(revision[0])
    put_setting(conn, "config.active", str(rev_id))
    existing = {r[0]: r for r in conn.execute(select(schema.nodes.c.name, schema.nodes.c.registered))}
    for spec in config.nodes:
        values = node_values(spec)
        if spec.name in existing:
            conn.execute(
                update(schema.nodes)
                .where(schema.nodes.c.name == spec.name)
                .values(declared=True, updated_at=now)
            )
        else:
            conn.execute(
                insert(schema.nodes).values(
                    name=spec.name,
                    state=NodeState.DOWN.value,
                    reason=WAITING_FOR_AGENT,
                    declared=True,
                    updated_at=now,
                    **values,
                )
            )
    model = load_cluster(conn)
    event = {"t": now, **cluster_event(model, model.config.nodes)}
    append_events(conn, [event], conn.dialect.name == "sqlite")
    return rev_id


def cluster_event(model: ClusterModel, nodes: Iterable[NodeSpec]) -> dict[str, Any]:
    """The `cluster` line of the event log (DESIGN.md 4.6) for `nodes` under the active configuration."""
    cfg = model.config
    line = cluster_line(cfg.topology, nodes, cfg.queues, cfg.priority_classes)
    return {"event": "cluster", "revision": model.revision, **line}
