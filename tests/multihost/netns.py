"""Several "hosts" on one machine: Linux network namespaces on a bridge (../shared/ENVIRONMENT.md).

`Network` builds, under a prefix unique to this test run, a switch namespace holding a bridge and
one namespace per host, each with an `eth0` on the bridge at `10.200.<net>.<i>/24` (`<net>` is
random per run). `run()` starts a process "on" a host (`ip netns exec`). `close()` kills every
process still inside the namespaces (all of them were started by the tests) and deletes them.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class NamespacesUnavailable(Exception):
    """`ip netns add` is not permitted here (not root, no CAP_SYS_ADMIN, or no `ip`)."""


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def probe() -> str | None:
    """None when this process may create network namespaces, else why not."""
    name = "crt-probe-" + secrets.token_hex(3)
    try:
        out = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run `ip netns add`: {exc}"
    if out.returncode != 0:
        return f"`ip netns add` is not permitted here: {out.stderr.strip()} (run as root)"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10, check=False)
    return None


class Network:
    """A bridge namespace and named host namespaces on `10.200.<net>.0/24`."""

    def __init__(self, hosts: dict[str, int]) -> None:
        """`hosts` maps a host's name to the last octet of its address (1..254)."""
        self.prefix = "crt" + secrets.token_hex(3)
        self.net = random.randint(1, 254)
        self.switch = f"{self.prefix}-sw"
        self.hosts = dict(hosts)
        self.created: list[str] = []

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def address(self, host: str) -> str:
        return f"10.200.{self.net}.{self.hosts[host]}"

    def up(self) -> float:
        """Create the namespaces and links; returns the seconds it took."""
        began = time.monotonic()
        try:
            self._add(self.switch)
        except RuntimeError as exc:
            raise NamespacesUnavailable(str(exc)) from exc
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts, start=1):
            ns, tmp = self.ns(host), f"{self.prefix}v{i}"
            self._add(ns)
            # created under a unique name, renamed eth0 inside its namespace
            _ip(
                "link",
                "add",
                tmp,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                f"port{i}",
                "netns",
                self.switch,
            )
            _ip("-n", ns, "link", "set", tmp, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", self.switch, "link", "set", f"port{i}", "master", "br0", "up")
        return time.monotonic() - began

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.created.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def link(self, host: str, up: bool) -> None:
        """Cut `host` off the bridge (its port down: peers see timeouts, not refusals), or heal it."""
        port = f"port{list(self.hosts).index(host) + 1}"
        _ip("-n", self.switch, "link", "set", port, "up" if up else "down")

    def host_pids(self, host: str) -> list[int]:
        """Every process inside `host`'s namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.ns(host)], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def run(self, host: str, argv: Sequence[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
        """Start `argv` inside `host`'s namespace, in its own session, output to `log`."""
        with open(log, "ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.ns(host), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **kw,
            )

    def pids(self) -> list[int]:
        """Every process inside one of these namespaces."""
        found: list[int] = []
        for ns in self.created:
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
            found += [int(p) for p in out.stdout.split()]
        return found

    def close(self, linger: float = 2.0) -> list[str]:
        """Kill what still runs inside after `linger` seconds, delete the namespaces; returns what
        had to be killed."""
        deadline = time.monotonic() + linger
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self.pids()
        described = [f"{pid} {_cmdline(pid)}" for pid in left]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self.created.clear()
        return described


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return "?"


class Loopback:
    """The same interface on one host without namespaces (the benchmark's fallback): every "host"
    is this machine, at its own loopback address `127.0.<net>.<i>`; processes are tracked by
    session instead of by namespace."""

    def __init__(self, hosts: dict[str, int]) -> None:
        self.net = random.randint(1, 254)
        self.hosts = dict(hosts)
        self.started: list[subprocess.Popen[bytes]] = []

    def address(self, host: str) -> str:
        return f"127.0.{self.net}.{self.hosts[host]}"

    def up(self) -> float:
        return 0.0

    def run(self, host: str, argv: Sequence[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **kw,
            )
        self.started.append(proc)
        return proc

    def close(self, linger: float = 2.0) -> list[str]:
        """Kill what is left in the sessions of the processes started here."""
        time.sleep(linger)
        left = []
        for proc in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
                left.append(f"session {proc.pid}")
        return left
