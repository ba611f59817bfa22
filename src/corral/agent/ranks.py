"""The pieces of a running attempt on this node: the identity its workers run as, each rank's
shim (`Rank`), a pending stop, how the node's part ended (`Outcome`), a log's tail, and the
agent's timing constants."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from corral.agent import records

KILL_AFTER = 5.0  # SIGTERM, then SIGKILL after this long, for the survivors of a failed rank
POLL_WAIT = 30.0
TICK = 0.05
HEARTBEAT_RETRY = 0.2  # after a failed heartbeat, the next one this soon, doubling ...
HEARTBEAT_RETRY_MAX = 2.0  # ... to at most this (with jitter): many tries inside one lease
HEARTBEAT_TIMEOUT = 5.0  # a heartbeat unanswered this long has failed (then retried)
CHECKPOINT_POLL = 1.0  # how often the agent looks for a newly recorded checkpoint
TAIL_LINES = 20
RECORD = "corral-checkpoint.json"  # written by corral.job.record_checkpoint
SHIM = str(Path(__file__).with_name("shim.py"))  # run as a file: importing `corral` is not needed
SHIM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # all the (maybe root) shim sees


class Identity:
    """The user a job runs as: its account, and the uid and gid the shim switches to (None when
    that is the agent's own user)."""

    def __init__(self, account: pwd.struct_passwd) -> None:
        self.account = account
        self.name, self.home, self.shell = account.pw_name, account.pw_dir, account.pw_shell
        switch = account.pw_uid != os.geteuid()
        self.uid = account.pw_uid if switch else None
        self.gid = account.pw_gid if switch else None


def exit_code_of(returncode: int) -> int:
    """A Popen return code as a shell shows it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_number(value: object) -> int:
    if isinstance(value, int):
        return value
    name = str(value or "SIGTERM").upper()
    if name.isdigit():
        return int(name)
    if not name.startswith("SIG"):
        name = "SIG" + name
    return int(getattr(signal, name, signal.SIGTERM))


@dataclass
class Stop:
    signal_at: float  # monotonic
    grace: float
    why: str


@dataclass
class Outcome:
    """How this node's part of an attempt ended, as the `exited` report says it."""

    code: int
    rank: int | None = None
    why: str = ""  # time_limit | setup | launch
    message: str = ""
    log_tail: str = ""


class Rank:
    """One rank's shim: a child of this agent (`popen`), or adopted from an earlier incarnation
    (then its exit status comes from the file the shim writes)."""

    def __init__(
        self,
        pid: int,
        exit_file: Path,
        popen: subprocess.Popen[bytes] | None = None,
        start: int | None = None,
    ) -> None:
        self.pid, self.exit_file, self.popen, self.start = pid, exit_file, popen, start
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.popen is not None:
            self.returncode = self.popen.poll()
            return self.returncode
        with contextlib.suppress(OSError, ValueError):
            self.returncode = int(self.exit_file.read_text().split()[0])
            return self.returncode
        if not records.alive(self.pid, self.start):
            self.returncode = -signal.SIGKILL  # gone without a word: killed (the fence, an OOM kill)
        return self.returncode


def tail_of(path: Path, lines: int = TAIL_LINES, limit: int = 4000) -> str:
    """The last lines of a log, at most `limit` characters (undecodable bytes replaced)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
