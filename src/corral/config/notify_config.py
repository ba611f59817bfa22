"""Webhook notifications in the cluster file (`notify:`) and the job spec's `notify` field.

Admins list the URL prefixes the control plane may ever call (`notify.allow`) and the sinks
(`notify.sinks`: a name, a URL under one of those prefixes, a signing secret, and optionally the
queues it serves). A job only chooses which of its own events to hear about; it never gives a
URL, so the control plane makes no request to an address a user chose (no SSRF).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from corral.config.invalid import InvalidValue
from corral.config.yaml_source import Locator
from corral.core.errors import ConfigError

__all__ = [
    "NOTIFY_EVENTS",
    "NotifyConfig",
    "NotifyEntry",
    "Sink",
    "SinkEntry",
    "build_notify",
    "check_secrets",
    "is_allowed",
    "notify_events",
]

# what a job may subscribe to: `start` (an attempt started), `end` (the job ended, whatever way),
# `fail` (it ended failed), `preempt` (an attempt was preempted or requeued), `restart` (a worker
# failure restarted it)
NOTIFY_EVENTS = ("start", "end", "fail", "preempt", "restart")
_SINK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DOCS = "see docs/control-plane.md (Notifications)"


def notify_events(value: object) -> tuple[str, ...]:
    """The job spec's `notify`: a list of event names (or one comma-separated string), checked."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise InvalidValue(
            f"{value!r} is not a list of events", f"write e.g. [end, fail]; events: {_names()}"
        )
    out: list[str] = []
    for item in items:
        name = item.strip().lower()
        if name not in NOTIFY_EVENTS:
            raise InvalidValue(f"unknown notification event {item!r}", f"use some of: {_names()}")
        if name not in out:
            out.append(name)
    return tuple(out)


def _names() -> str:
    return ", ".join(NOTIFY_EVENTS)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class SinkEntry(_Entry):
    """One `notify.sinks:` entry."""

    name: str
    url: str
    secret_file: str | None = None
    secret_env: str | None = None
    queues: list[str] = Field(default_factory=list)  # empty: every queue's jobs


class NotifyEntry(_Entry):
    """`notify:` of the cluster file."""

    allow: list[str] = Field(default_factory=list)
    sinks: list[SinkEntry] = Field(default_factory=list)
    max_attempts: int = Field(12, ge=1, le=100)
    backoff: float = Field(2.0, gt=0, le=3600)  # seconds before the first retry, doubling
    backoff_max: float = Field(600.0, gt=0, le=86400)
    timeout: float = Field(10.0, gt=0, le=120)  # seconds per request


@dataclass(frozen=True, slots=True)
class Sink:
    """A webhook sink: where, how its requests are signed, and which queues' jobs it serves."""

    name: str
    url: str
    secret_file: str | None
    secret_env: str | None
    queues: tuple[str, ...]

    def serves(self, queue: str) -> bool:
        return not self.queues or queue in self.queues


@dataclass(frozen=True, slots=True)
class NotifyConfig:
    """The checked `notify:` section; `sinks` is empty when notifications are not configured."""

    allow: tuple[str, ...] = ()
    sinks: tuple[Sink, ...] = ()
    max_attempts: int = 12
    backoff: float = 2.0
    backoff_max: float = 600.0
    timeout: float = 10.0

    def sink(self, name: str) -> Sink | None:
        return next((s for s in self.sinks if s.name == name), None)

    def sinks_for(self, queue: str) -> tuple[Sink, ...]:
        return tuple(s for s in self.sinks if s.serves(queue))


def _parts(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of an http(s) URL without credentials, query or fragment."""
    try:
        split = urlsplit(url)
        port = split.port
    except ValueError:
        return None
    if split.scheme not in ("http", "https") or not split.hostname or split.username or split.password:
        return None
    if split.query or split.fragment or "\\" in url or any(c.isspace() for c in url):
        return None
    default = 443 if split.scheme == "https" else 80
    return split.scheme, split.hostname.lower(), port or default, split.path or "/"


def is_allowed(url: str, allow: Sequence[str]) -> bool:
    """True when `url` lies under one of the prefixes of `allow`: same scheme, host and port, and a
    path at or below the prefix's (by whole segments: `/hooks` allows `/hooks/a`, not `/hooksx`).
    Compared on parsed parts, never as strings (`https://good@evil/` is not under `https://good`)."""
    target = _parts(url)
    if target is None or "%2e" in target[3].lower() or {".", ".."} & set(target[3].split("/")):
        return False
    for prefix in allow:
        base = _parts(prefix)
        if base is None or base[:3] != target[:3]:
            continue
        root = base[3].rstrip("/")
        if target[3] == root or target[3].startswith(root + "/"):
            return True
    return False


def build_notify(entry: NotifyEntry | None, queues: Sequence[str], loc: Locator) -> NotifyConfig:
    """Check `notify:`: every allow entry a plain http(s) URL, every sink's URL under one of
    them, a secret for each sink, known queues; ConfigError names the field and the fix."""
    if entry is None:
        return NotifyConfig()
    for i, prefix in enumerate(entry.allow):
        if _parts(prefix) is None:
            raise loc.error(
                ("notify", "allow", i),
                f"{prefix!r} is not an http(s) URL prefix",
                "write e.g. https://hooks.example.com/corral/ (no user, query or fragment)",
            )
    sinks: list[Sink] = []
    for i, sink in enumerate(entry.sinks):
        sinks.append(_build_sink(sink, i, entry.allow, queues, loc))
        if any(s.name == sink.name for s in sinks[:-1]):
            raise loc.error(
                ("notify", "sinks", i, "name"), f"sink {sink.name!r} is declared twice", "rename one"
            )
    return NotifyConfig(
        allow=tuple(entry.allow),
        sinks=tuple(sinks),
        max_attempts=entry.max_attempts,
        backoff=entry.backoff,
        backoff_max=max(entry.backoff_max, entry.backoff),
        timeout=entry.timeout,
    )


def _build_sink(sink: SinkEntry, i: int, allow: list[str], queues: Sequence[str], loc: Locator) -> Sink:
    path = ("notify", "sinks", i)
    if not _SINK_NAME.fullmatch(sink.name):
        raise loc.error(
            (*path, "name"),
            f"{sink.name!r} is not a sink name",
            "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    if not is_allowed(sink.url, allow):
        listed = ", ".join(allow) or "none: `notify.allow` is empty"
        raise loc.error(
            (*path, "url"),
            f"sink {sink.name}: {sink.url} is not under any URL of notify.allow ({listed})",
            "point the sink at a URL under an allowed prefix, or have an admin add the prefix to "
            f"notify.allow; {_DOCS}",
        )
    if (sink.secret_file is None) == (sink.secret_env is None):
        raise loc.error(
            path,
            f"sink {sink.name} needs exactly one of secret_file and secret_env",
            "give secret_file: /path/readable/by/the/server (or secret_env: VARIABLE); "
            "its content signs each request",
        )
    for k, name in enumerate(sink.queues):
        if name not in queues:
            raise loc.error(
                (*path, "queues", k), f"unknown queue {name!r}", f"use one of: {', '.join(queues)}"
            )
    return Sink(sink.name, sink.url, sink.secret_file, sink.secret_env, tuple(sink.queues))


def check_secrets(notify: NotifyConfig, source: str) -> None:
    """ConfigError for a sink whose secret this process cannot read (run where the deliveries
    are sent from: the API process, when a revision is applied)."""
    for i, sink in enumerate(notify.sinks):
        where = f"notify.sinks[{i}]"
        if sink.secret_file is not None:
            try:
                with open(sink.secret_file, "rb") as f:
                    empty = not f.read().strip()
            except OSError as exc:
                raise ConfigError(
                    f"sink {sink.name}: secret_file {sink.secret_file} cannot be read ({exc.strerror})",
                    source=source,
                    where=where,
                    fix="create it on the server's machine, readable by the server's user only (chmod 600)",
                ) from None
        else:
            empty = not os.environ.get(str(sink.secret_env), "").strip()
        if empty:
            what = f"secret_file {sink.secret_file}" if sink.secret_file else f"${sink.secret_env}"
            raise ConfigError(
                f"sink {sink.name}: {what} is empty or unset in the server's environment",
                source=source,
                where=where,
                fix="put a long random secret there (e.g. `openssl rand -hex 32`), shared with the receiver",
            )
