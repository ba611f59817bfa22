"""`corral submit`'s job spec: a spec file (`-f`), its fields overridden by flags, the argv after `--`.

The result is the job spec of DESIGN.md 4.2 as the API takes it; the server checks it (and
answers 422 with the field and the fix), so only what the flags themselves spell is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.core.errors import ConfigError


@dataclass(frozen=True)
class SubmitFlags:
    """The flags of `corral submit`; None (or empty) means "not given": the file's value stays."""

    name: str | None = None
    queue: str | None = None
    priority: str | None = None
    replicas: int | None = None
    gpus_per_replica: int | None = None
    launch: str | None = None
    gpu_model: tuple[str, ...] = ()
    pack: str | None = None
    pack_required: bool | None = None
    time_limit: str | None = None
    preemptible: bool | None = None
    checkpoint_signal: str | None = None
    checkpoint_grace: str | None = None
    max_restarts: int | None = None
    cpus_per_replica: int | None = None
    memory_gib_per_replica: float | None = None
    env: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    working_dir: str | None = None
    notify: str | None = None  # `--notify end,fail,preempt`
    array: str | None = None  # Slurm's --array (config/array_spec.py), checked by the server
    dependency: str | None = None
    command: tuple[str, ...] = field(default=())


def load_spec_file(path: Path) -> dict[str, Any]:
    """A job spec file, checked with line numbers (ConfigError), as a plain mapping."""
    from corral.config.job_spec import parse_job_spec
    from corral.config.yaml_source import load_yaml

    data, lines = load_yaml(path)
    parse_job_spec(data, str(path), lines)
    return dict(data) if isinstance(data, dict) else {}


def apply_flags(spec: dict[str, Any], flags: SubmitFlags) -> dict[str, Any]:
    """`spec` with the given flags applied; ConfigError (naming the flag) for a malformed value."""
    out = dict(spec)
    plain = {
        "name": flags.name,
        "queue": flags.queue,
        "replicas": flags.replicas,
        "gpus_per_replica": flags.gpus_per_replica,
        "launch": flags.launch,
        "time_limit": flags.time_limit,
        "preemptible": flags.preemptible,
        "max_restarts": flags.max_restarts,
        "working_dir": flags.working_dir,
        "cpus_per_replica": flags.cpus_per_replica,
        "memory_gib_per_replica": flags.memory_gib_per_replica,
        "array": flags.array,
        "dependency": flags.dependency,
    }
    out.update({k: v for k, v in plain.items() if v is not None})
    if flags.priority is not None:
        text = flags.priority.strip()
        out["priority"] = int(text) if text.lstrip("-").isdigit() else text
    if flags.gpu_model:
        out["gpu_model"] = list(flags.gpu_model) if len(flags.gpu_model) > 1 else flags.gpu_model[0]
    _merge(out, "topology", {"pack": flags.pack, "required": flags.pack_required})
    _merge(out, "checkpoint", {"signal": flags.checkpoint_signal, "grace": flags.checkpoint_grace})
    if flags.env:
        env = dict(out.get("env") or {})
        env.update(parse_env(item) for item in flags.env)
        out["env"] = env
    if flags.mounts:
        added = [parse_mount(item) for item in flags.mounts]
        targets = {m["target"] for m in added}
        kept = [
            m for m in out.get("mounts") or [] if not (isinstance(m, dict) and m.get("target") in targets)
        ]
        out["mounts"] = kept + added
    if flags.notify is not None:
        out["notify"] = [e.strip() for e in flags.notify.split(",") if e.strip()]
    if flags.command:
        out["command"] = list(flags.command)
    return out


def _merge(out: dict[str, Any], key: str, values: dict[str, Any]) -> None:
    given = {k: v for k, v in values.items() if v is not None}
    if given:
        current = out.get(key)
        out[key] = {**(current if isinstance(current, dict) else {}), **given}


def parse_env(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise ConfigError(
            f"{item!r} is not NAME=VALUE", where="--env", fix="write e.g. --env WANDB_MODE=offline"
        )
    return name, value


def parse_mount(item: str) -> dict[str, Any]:
    parts = item.split(":")
    mode = ""
    if len(parts) == 3:
        *parts, mode = parts
    if len(parts) != 2 or not all(parts) or mode not in ("", "ro", "rw"):
        raise ConfigError(
            f"{item!r} is not SOURCE:TARGET[:ro]",
            where="--mount",
            fix="write e.g. --mount /datasets:/data:ro",
        )
    return {"source": parts[0], "target": parts[1], "read_only": mode == "ro"}


def largest_node_gpus(nodes: list[dict[str, Any]]) -> int:
    """The GPUs of the largest node the server knows (declared or registered, any state)."""
    return max((int(n.get("gpus", 0)) for n in nodes), default=0)
