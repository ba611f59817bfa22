"""How the agent contains an attempt's processes: cgroups, bind mounts, the user, detected once.

- **cgroups**: each attempt gets a group under the agent's own cgroup v2 (`corral/<job>-<n>`,
  on the unified hierarchy, `/sys/fs/cgroup` or the hybrid `/sys/fs/cgroup/unified`). Workers
  enter it before they `exec` (so their children, `setsid` escapees included, are in it too),
  and it is killed whole with `cgroup.kill` (or by signalling each listed process on kernels
  without it). CPU and memory limits use the v2 controllers where the group has them, else the
  v1 `cpu` and `memory` hierarchies of a hybrid machine. Without a writable cgroup hierarchy the
  agent falls back to process groups and says so in its log.
- **mounts**: the job's `mounts` become bubblewrap (`bwrap`) bind mounts over the host's root; each
  source is checked before launch, and a missing source (or a node without `bwrap`) fails the
  attempt at once with its reason: never a silent skip.
- **user**: a job runs as the Unix user its token maps to (`corral token create --run-as`), never
  one from the spec; with no mapping, as the agent's `--default-user` (an agent running as root:
  `nobody`; otherwise the agent's own user). Never as root (uid 0) unless the node was started
  with `--allow-root-jobs`. The switch itself happens in the shim (`corral.agent.shim`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import shutil
import signal
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("corral.agent")

UNPRIVILEGED = "nobody"  # whom a root agent runs jobs as when their token maps to no user


class SetupError(Exception):
    """The attempt cannot run on this node as specified; no restart would help."""


def _own_cgroup_v2() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    return None


def _own_cgroup_v1(controller: str) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return path
    return None


def _unified_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (pure v2, or hybrid's `unified`)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    return None


def _v1_mount(controller: str) -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[2] == "cgroup" and controller in parts[3].split(","):
                return Path(parts[1])
    return None


@dataclass
class Capabilities:
    """What this machine lets the agent use, found once at start."""

    cgroup_base: Path | None = None  # the v2 group under which attempts' groups are made
    v1_bases: dict[str, Path] = field(default_factory=dict)  # controller -> base group (hybrid)
    bwrap: str | None = None
    is_root: bool = False
    default_user: str = ""
    allow_root: bool = False  # `corral agent --allow-root-jobs`: uid 0 may run jobs here
    notes: list[str] = field(default_factory=list)

    @classmethod
    def detect(
        cls,
        node: str,
        default_user: str | None = None,
        data_dir: Path | None = None,
        allow_root: bool = False,
    ) -> Capabilities:
        """`data_dir` names the agent's groups: two agents on one machine (tests, `corral up` beside
        an agent) never share one, so neither kills the other's workers."""
        caps = cls(is_root=os.geteuid() == 0, bwrap=shutil.which("bwrap"), allow_root=allow_root)
        if data_dir is not None:
            node = f"{node}-{hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:8]}"
        own = pwd.getpwuid(os.geteuid()).pw_name
        caps.default_user = default_user or (UNPRIVILEGED if caps.is_root else own)
        mount, own_group = _unified_mount(), _own_cgroup_v2()
        why = "no cgroup v2 hierarchy is mounted"
        if mount is not None and own_group is not None:
            base = mount / own_group.lstrip("/") / f"corral-{node}"
            try:
                base.mkdir(parents=True, exist_ok=True)
                probe = base / "probe"
                probe.mkdir(exist_ok=True)
                probe.rmdir()
                caps.cgroup_base = base
            except OSError as exc:
                why = f"cannot create cgroups under {base.parent}: {exc.strerror}"
        if caps.cgroup_base is None:
            caps.notes.append(
                f"cgroups unavailable ({why}): workers run as process groups, so a process that "
                "calls setsid escapes a kill and no CPU or memory limits apply"
            )
        else:
            controllers = _read(caps.cgroup_base / "cgroup.controllers").split()
            for name in ("cpu", "memory"):
                if name in controllers:
                    continue
                v1, own1 = _v1_mount(name), _own_cgroup_v1(name)
                if v1 is None or own1 is None:
                    caps.notes.append(f"no {name} controller: {name} limits of jobs are not enforced")
                    continue
                base1 = v1 / own1.lstrip("/") / f"corral-{node}"
                try:
                    base1.mkdir(parents=True, exist_ok=True)
                    caps.v1_bases[name] = base1
                except OSError as exc:
                    caps.notes.append(f"cannot use the v1 {name} hierarchy ({exc.strerror}): not enforced")
            with contextlib.suppress(OSError):  # let job groups have the v2 controllers there are
                wanted = [c for c in ("cpu", "memory", "pids") if c in controllers]
                if wanted:
                    (caps.cgroup_base / "cgroup.subtree_control").write_text(
                        " ".join("+" + c for c in wanted)
                    )
        if caps.bwrap is None:
            caps.notes.append("bubblewrap (bwrap) not found: jobs with mounts fail on this node")
        if caps.allow_root:
            caps.notes.append("--allow-root-jobs: jobs whose token maps to root run as root on this node")
        return caps

    def summary(self) -> str:
        cg = f"cgroups under {self.cgroup_base}" if self.cgroup_base else "process groups"
        return f"workers in {cg}; mounts {'with ' + self.bwrap if self.bwrap else 'unavailable'}"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class Group:
    """One attempt's cgroup on this node (v2, plus v1 limit groups on a hybrid machine)."""

    def __init__(self, caps: Capabilities, name: str) -> None:
        self.paths: list[Path] = []
        self.v2: Path | None = None
        if caps.cgroup_base is None:
            return
        self.v2 = caps.cgroup_base / name
        self.v2.mkdir(exist_ok=True)
        self.paths.append(self.v2)
        for base in caps.v1_bases.values():
            path = base / name
            path.mkdir(exist_ok=True)
            self.paths.append(path)

    @classmethod
    def existing(cls, caps: Capabilities, v2: Path) -> Group:
        """The group of an attempt an earlier incarnation of the agent made: its v2 group and the
        v1 groups of the same name, so that all of them are removed when the attempt ends."""
        group = cls.__new__(cls)
        group.v2, group.paths = v2, [v2]
        group.paths += [base / v2.name for base in caps.v1_bases.values() if (base / v2.name).is_dir()]
        return group

    def limit(self, cpus: float, memory_bytes: int) -> None:
        """CPU (in CPUs) and memory limits for the whole attempt on this node; 0 means none."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                if cpus > 0 and (path / "cpu.max").exists():
                    (path / "cpu.max").write_text(f"{int(cpus * 100_000)} 100000")
                elif cpus > 0 and (path / "cpu.cfs_quota_us").exists():
                    (path / "cpu.cfs_period_us").write_text("100000")
                    (path / "cpu.cfs_quota_us").write_text(str(int(cpus * 100_000)))
                if memory_bytes > 0 and (path / "memory.max").exists():
                    (path / "memory.max").write_text(str(memory_bytes))
                elif memory_bytes > 0 and (path / "memory.limit_in_bytes").exists():
                    (path / "memory.limit_in_bytes").write_text(str(memory_bytes))

    def entry_fds(self) -> list[int]:
        """Files a new worker writes "0" to (itself) before exec, opened here by the agent."""
        fds = []
        for path in self.paths:
            with contextlib.suppress(OSError):
                fds.append(os.open(path / "cgroup.procs", os.O_WRONLY))
        return fds

    def pids(self) -> list[int]:
        if self.v2 is None:
            return []
        return [int(p) for p in _read(self.v2 / "cgroup.procs").split()]

    def kill(self) -> None:
        """Kill every process of the attempt on this node, escapees of the session included."""
        if self.v2 is None:
            return
        try:
            (self.v2 / "cgroup.kill").write_text("1")
            return
        except OSError:
            pass
        for _ in range(3):  # no cgroup.kill (kernel < 5.14): signal what is listed, a few times
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def empty(self, wait: float = 0.0) -> bool:
        deadline = time.monotonic() + wait
        while self.pids():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def remove(self) -> None:
        for path in reversed(self.paths):
            with contextlib.suppress(OSError):
                path.rmdir()


def remove_empty_groups(caps: Capabilities) -> list[str]:
    """Remove the attempt groups (v2 and v1) an earlier agent of this data directory left empty
    (killed with -9 before it removed them); a group that still holds processes stays (rmdir
    refuses it). Called at start, before any attempt is launched. Returns the paths removed."""
    removed = []
    for base in [caps.cgroup_base, *caps.v1_bases.values()]:
        if base is None:
            continue
        try:
            children = [p for p in base.iterdir() if p.is_dir()]
        except OSError:
            continue
        for child in children:
            with contextlib.suppress(OSError):
                child.rmdir()
                removed.append(str(child))
    return removed


def user_of(caps: Capabilities, run_as: str) -> pwd.struct_passwd:
    """The account a job runs as (its token's `run_as`, else the node's default user). Raises
    SetupError when this node cannot run it: no such user, root on a node that does not allow
    it, or another user than the agent's own while the agent is not root."""
    name = run_as or caps.default_user
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise SetupError(f"user {name!r} does not exist on this node") from None
    if account.pw_uid == 0 and not caps.allow_root:
        raise SetupError(
            f"user {name!r} is root and this node does not run jobs as root: map the token to an "
            "unprivileged user (corral token create --run-as), or start the node's agent with "
            "--allow-root-jobs"
        )
    if account.pw_uid != os.geteuid() and not caps.is_root:
        me = pwd.getpwuid(os.geteuid()).pw_name
        raise SetupError(f"the agent runs as {me} and cannot start jobs as {name!r}")
    return account


def blocked_on_the_way(path: Path, account: pwd.struct_passwd) -> Path | None:
    """The first folder on the way to `path` (itself included) that `account` cannot pass
    through (no search permission for it, with its primary group only), or None."""
    if account.pw_uid == 0:
        return None
    folder = Path("/")
    for part in [None, *path.resolve().parts[1:]]:
        folder = folder / part if part else folder
        try:
            info = folder.stat()
        except OSError:
            return folder
        if info.st_uid == account.pw_uid:
            bit = stat.S_IXUSR
        elif info.st_gid == account.pw_gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return folder
    return None


def check_reach(path: Path, account: pwd.struct_passwd) -> None:
    """SetupError when the job's user could not enter `path` (its working directory)."""
    blocked = blocked_on_the_way(path, account)
    if blocked is not None:
        raise SetupError(
            f"user {account.pw_name!r} cannot enter {path}: {blocked} is closed to it; give the "
            "job a working_dir it can enter, or put the agent's data directory (--data-dir, "
            "CORRAL_DATA_DIR) where it can pass through (e.g. /var/lib/corral)"
        )


def closed_data_dir(caps: Capabilities, data_dir: Path) -> list[str]:
    """A note for the agent's log when its default user's jobs could not reach their folders."""
    try:
        account = pwd.getpwnam(caps.default_user)
    except KeyError:
        return [f"default user {caps.default_user!r} does not exist: jobs without --run-as fail"]
    blocked = blocked_on_the_way(data_dir, account)
    if blocked is None or not caps.is_root:
        return []
    return [
        f"{blocked} is closed to {account.pw_name}, so its jobs cannot enter their folders under "
        f"{data_dir}: choose a --data-dir it can pass through (e.g. /var/lib/corral)"
    ]


def check_mounts(caps: Capabilities, mounts: list[dict[str, Any]]) -> None:
    """Every source must exist on this node, and bwrap must be there to bind it."""
    for m in mounts:
        source = Path(str(m.get("source", "")))
        if not source.is_absolute() or not source.exists():
            raise SetupError(f"mount source {source} does not exist on this node")
        if not str(m.get("target", "")).startswith("/"):
            raise SetupError(f"mount target {m.get('target')!r} must be an absolute path")
    if mounts and caps.bwrap is None:
        raise SetupError("this node has no bubblewrap (bwrap) to bind the job's mounts: install it")


def wrap(caps: Capabilities, argv: list[str], mounts: list[dict[str, Any]], cwd: str) -> list[str]:
    """The argv to exec: the job's own, or bwrap binding the mounts over the host's root."""
    if not mounts:
        return argv
    assert caps.bwrap is not None
    out = [caps.bwrap, "--dev-bind", "/", "/"]
    for m in mounts:
        kind = "--ro-bind" if m.get("read_only") else "--bind"
        out += [kind, str(m["source"]), str(m["target"])]
    return [*out, "--chdir", cwd, "--", *argv]


def preexec(fds: list[int]) -> Any:
    """What a rank's shim runs between fork and exec: join the attempt's cgroups (the shim drops
    to the job's user itself). Only system calls on values prepared by the parent."""
    data = b"0"

    def run() -> None:
        for fd in fds:
            os.write(fd, data)

    return run
