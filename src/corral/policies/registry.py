"""The one registry of plugins and the built-in policies; a profile fails loudly at load.

A policy is a named profile: which plugin fills each extension point, with which arguments.
`load_policy("default", {"fair_share": {"half_life": 3600}})` returns a `Profile`; an unknown
policy, plugin or argument raises `ConfigError` naming it and listing what is known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from corral.core.errors import ConfigError
from corral.core.plugins import Profile
from corral.policies.fair_share import FairShare
from corral.policies.ordering import Fifo, LeastAttained, PriorityFifo, ShortestEstimated, ShortestFirst
from corral.policies.quota import Limit, Quota
from corral.policies.tiresias import Tiresias
from corral.policies.victims import AttainedService, PriorityReclaim

PLUGINS: dict[str, type[Any]] = {
    "priority_fifo": PriorityFifo,
    "fifo": Fifo,
    "sjf": ShortestFirst,
    "las": LeastAttained,
    "shortest_estimated": ShortestEstimated,
    "fair_share": FairShare,
    "limit": Limit,
    "quota": Quota,
    "priority_reclaim": PriorityReclaim,
    "attained_service": AttainedService,
    "tiresias": Tiresias,
}

# extension point -> plugin name (or names), per built-in policy; plus cycle settings.
POLICIES: dict[str, dict[str, Any]] = {
    "default": {
        "description": "fair share, quotas, topology, preemption and reclaim, reservations, backfill",
        "order": "priority_fifo",
        "queue_order": "fair_share",
        "admit": ["limit", "quota"],
        "victims": "priority_reclaim",
        "backfill": True,
        "max_reservations": 8,
    },
    "estimated": {
        "description": "default, with run times estimated from history: inside a queue, shortest "
        "estimated run time first, aged by waiting; reservations from the estimated ends of jobs "
        "without a time limit",
        "order": "shortest_estimated",
        "queue_order": "fair_share",
        "admit": ["limit", "quota"],
        "victims": "priority_reclaim",
        "backfill": True,
        "max_reservations": 8,
        # estimated ends hold GPUs at once on a confident estimate, otherwise for a job that has
        # waited a day (docs/benchmarks.md, "Overload quality")
        "hold_after": 86400.0,
    },
    "tiresias": {
        "description": "default, with Tiresias' discretised least attained service inside a queue: "
        "jobs wait by attained-service level, then by submit time delayed by 4 x the estimated remaining "
        "run time (shortest expected first, aged by waiting); a waiting job preempts a job of its queue "
        "and class in a worse level that would lose little work",
        "order": "tiresias",
        "queue_order": "fair_share",
        "admit": ["limit", "quota"],
        "victims": "tiresias",
        "backfill": True,
        "max_reservations": 8,
    },
    "fifo": {
        "description": "strict head-of-line FIFO in submit order: no skipping, no backfill, no preemption, "
        "quotas ignored, limits honoured (the Helios artifact's baseline)",
        "order": "fifo",
        "queue_order": None,
        "admit": ["limit"],
        "victims": None,
        "head_of_line": True,
        "backfill": False,
    },
    "sjf": {
        "description": "shortest job first by TRUE duration: an oracle bound for simulations, "
        "not a real policy; non-preemptive with head-of-line blocking as in the Helios artifact",
        "order": "sjf",
        "queue_order": None,
        "admit": ["limit"],
        "victims": None,
        "head_of_line": True,
        "backfill": False,
    },
    "las": {
        "description": "Tiresias-style discretised least attained service, preemptive, work-conserving",
        "order": "las",
        "queue_order": None,
        "admit": ["limit"],
        "victims": "attained_service",
        "backfill": False,
    },
}


def args_class(cls: type[Any]) -> type[Any]:
    """The dataclass of a plugin's arguments: the type of its `args` field's default."""
    field = next(f for f in dataclasses.fields(cls) if f.name == "args")
    if field.default is not dataclasses.MISSING:
        return type(field.default)
    factory = field.default_factory
    assert callable(factory), f"plugin {cls.__name__}: its `args` field has no default"
    return type(factory())


def policy_names() -> list[str]:
    return sorted(POLICIES)


def _make(plugin: str, args: Mapping[str, Any] | None, where: str) -> Any:
    cls = PLUGINS.get(plugin)
    if cls is None:
        raise ConfigError(
            f"unknown plugin {plugin!r}", where=where, fix=f"use one of {', '.join(sorted(PLUGINS))}"
        )
    arg_cls = args_class(cls)
    known = {f.name for f in dataclasses.fields(arg_cls)}
    given = dict(args or {})
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(
            f"plugin {plugin} has no argument {', '.join(unknown)}",
            where=where,
            fix=f"its arguments are: {', '.join(sorted(known)) or 'none'}",
        )
    tuples = {f.name for f in dataclasses.fields(arg_cls) if isinstance(f.default, tuple)}
    for name, value in given.items():
        if isinstance(value, list):
            given[name] = tuple(value)
        elif name in tuples and not isinstance(value, tuple):
            given[name] = (value,)  # one value for a list argument: a list of one
    try:
        return cls(arg_cls(**given))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad arguments for plugin {plugin}: {exc}", where=where) from exc


def load_policy(name: str, args: Mapping[str, Mapping[str, Any]] | None = None) -> Profile:
    """Build a built-in policy, with per-plugin argument overrides keyed by plugin name."""
    spec = POLICIES.get(name)
    if spec is None:
        raise ConfigError(
            f"unknown policy {name!r}", where="--policy", fix=f"use one of {', '.join(policy_names())}"
        )
    args = dict(args or {})
    used = plugins_of(name)
    stray = sorted(set(args) - used)
    if stray:
        raise ConfigError(
            f"policy {name} does not use plugin {', '.join(stray)}",
            where="policy arguments",
            fix=f"its plugins are: {', '.join(sorted(str(u) for u in used))}",
        )

    def make(plugin: str | None) -> Any:
        return None if plugin is None else _make(plugin, args.get(plugin), f"policy {name}")

    job_order = make(spec["order"])
    hold_after = spec.get("hold_after")
    if isinstance(job_order, Tiresias) and job_order.args.hold_after is not None:
        hold_after = job_order.args.hold_after  # `tiresias.hold_after`: estimated reservations
    queue_order = make(spec.get("queue_order"))
    half_life = queue_order.args.half_life if isinstance(queue_order, FairShare) else None
    return Profile(
        name=name,
        job_order=job_order,
        queue_order=queue_order,
        admits=tuple(make(p) for p in spec.get("admit", [])),
        victims=make(spec.get("victims")),
        head_of_line=bool(spec.get("head_of_line", False)),
        backfill=bool(spec.get("backfill", True)),
        max_reservations=int(spec.get("max_reservations", 8)),
        hold_after=None if hold_after is None else float(hold_after),
        usage_half_life=half_life,
        description=str(spec["description"]),
        args={k: dict(v) for k, v in args.items()},
    )


def policy_arguments(
    name: str, args: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Every argument of each plugin of a policy as it takes effect (the defaults with `args` over
    them), by plugin; ConfigError as `load_policy`."""
    load_policy(name, args)
    return {
        plugin: dataclasses.asdict(_make(plugin, (args or {}).get(plugin), f"policy {name}").args)
        for plugin in sorted(plugins_of(name))
    }


def plugins_of(name: str) -> set[str]:
    """The plugins a built-in policy uses (the keys its arguments may have)."""
    spec = POLICIES[name]
    return {spec["order"], spec.get("queue_order"), spec.get("victims"), *spec.get("admit", [])} - {None}


def parse_plugin_args(items: list[str]) -> dict[str, dict[str, Any]]:
    """`PLUGIN.KEY=VALUE` items (the command line's `--arg`) as `load_policy` arguments; numbers
    and true/false are converted, anything else stays text; a value with commas is a list
    (`--arg tiresias.thresholds=3600,57600`), `[]` an empty one."""
    args: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        plugin, dot, field = key.partition(".")
        if not sep or not dot or not plugin or not field:
            raise ConfigError(
                f"--arg {item!r}: write PLUGIN.KEY=VALUE", fix="e.g. --arg priority_reclaim.surplus=true"
            )
        args.setdefault(plugin, {})[field] = _value(value)
    return args


def _value(text: str) -> object:
    stripped = text.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        inner = stripped[1:-1].strip()
        return [_scalar(part.strip()) for part in inner.split(",")] if inner else []
    if "," in text:
        return [_scalar(part.strip()) for part in text.split(",")]
    return _scalar(text)


def _scalar(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)
