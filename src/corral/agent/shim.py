"""`python -I -S shim.py LAUNCH_FILE`: one rank's parent, started by the agent.

The agent starts each rank through this shim (as containerd-shim and slurmstepd sit between a
runtime and its processes): the shim forks the rank, waits for it, and writes its exit status to
the exit file, so that a restarted agent learns how a rank it did not start ended.

The shim may run as root, so nothing the job controls reaches it (DESIGN.md 6.6): the agent
starts it with a minimal environment and `-I -S` (no `PYTHON*` variable, no user site, no
current directory on the path, no site-packages: the standard library only), from `/`. What
the rank needs (argv, environment, working directory, user) is in LAUNCH_FILE, a JSON file the
agent wrote in a folder only it can write. The forked child drops to the job's user first, then
sets a usual umask, enters the working directory and execs the rank with the job's environment:
the job's `LD_PRELOAD`, `PYTHONPATH` or `PATH` only ever act on the job's own processes.

The shim leads the rank's process group, which SIGKILL reaches whole; any other signal the agent
sends the shim alone, and the shim passes it to the rank's main process (through bwrap, which does
not forward signals, to bwrap's child), so that a child of the rank, a `sleep` or a data loader,
is not stopped under it.

A terminal session (`"tty": true` in the launch file, `corral.agent.terminal`) is started the
same way with a pseudo-terminal on its standard streams: the child makes it its controlling
terminal in a session of its own (so Ctrl-C reaches the shell's foreground job) before it drops
to the job's user.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import termios
from typing import Any

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
WORKER_UMASK = 0o022


def _become(launch: dict[str, Any]) -> None:
    """In the child: drop to the job's user, then enter its working directory and exec it."""
    uid, gid, cwd = launch.get("uid"), launch.get("gid"), str(launch.get("cwd") or "/")
    argv = [str(a) for a in launch["argv"]]
    env = {str(k): str(v) for k, v in launch["env"].items()}
    step = "become the job's user"
    try:
        if launch.get("tty"):  # a terminal session (`corral.agent.terminal`): the pty on 0-2 is its own
            step = "take the terminal"
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            step = "become the job's user"
        if isinstance(gid, int):
            os.setgroups([])
            os.setresgid(gid, gid, gid)
        if isinstance(uid, int):
            os.setresuid(uid, uid, uid)
            if 0 in os.getresuid() and uid != 0:  # never go on as root by mistake
                raise PermissionError("root privileges are still held")
        os.umask(WORKER_UMASK)
        step = f"enter the working directory {cwd}"
        os.chdir(cwd)
        step = f"launch {argv!r}"
        os.execvpe(argv[0], argv, env)  # the PATH of the job's env, searched as the job's user
    except OSError as exc:
        os.write(2, f"corral: could not {step}: {exc}\n".encode(errors="replace"))
    os._exit(127)


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code


def main(args: list[str]) -> int:
    if len(args) != 1:
        print("usage: python -I -S shim.py LAUNCH_FILE", file=sys.stderr)
        return 2
    with open(args[0], "rb") as f:
        launch = json.loads(f.read())
    os.unlink(args[0])  # it holds the job's environment: no copy left beside the exit file
    exit_file = str(launch["exit_file"])
    argv = launch.get("argv") or []
    wrapped = bool(argv) and os.path.basename(str(argv[0])) == "bwrap"
    started: list[int] = []
    early: list[int] = []  # signals that came before the child existed: passed on once it does

    def forward(sig: int, _frame: object) -> None:
        if not started:
            early.append(sig)
        for child in started:
            for pid in _main_pids(child, wrapped):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    for sig in FORWARDED:  # a caught signal resets to its default at exec: the rank gets the defaults
        signal.signal(sig, forward)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _become(launch)
    started.append(pid)
    for pending in early:
        forward(pending, None)
    code = _wait(pid)
    tmp = f"{exit_file}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{code}\n")
    os.replace(tmp, exit_file)
    return code


def _main_pids(pid: int, wrapped: bool) -> list[int]:
    """The rank's main process: the child, or bwrap's children when the child is bwrap."""
    if not wrapped:
        return [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(p) for p in children.read().split()] or [pid]
    except OSError:
        return [pid]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
