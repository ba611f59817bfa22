"""`python -m corral.agent.shim EXIT_FILE [--uid U --gid G] -- ARGV...`: one rank's parent.

The agent starts each rank through this shim (as containerd-shim and slurmstepd sit between a
runtime and its processes): the shim starts ARGV (as the given user), waits for it, and writes its
exit status to EXIT_FILE, so that a restarted agent learns how a rank it did not start ended. The
shim leads the rank's process group, which SIGKILL reaches whole; any other signal the agent sends
the shim alone, and the shim passes it to the rank's main process (through bwrap, which does not
forward signals, to bwrap's child), so that a child of the rank, a `sleep` or a data loader, is
not stopped under it. It imports the standard library only (it starts with every rank).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


def main(args: list[str]) -> int:
    if "--" not in args:
        print("usage: python -m corral.agent.shim EXIT_FILE [--uid U --gid G] -- ARGV...", file=sys.stderr)
        return 2
    split = args.index("--")
    head, argv = args[:split], args[split + 1 :]
    exit_file = head[0]
    opts = dict(zip(head[1::2], head[2::2], strict=False))
    started: list[subprocess.Popen[bytes]] = []
    wrapped = bool(argv) and os.path.basename(argv[0]) == "bwrap"

    early: list[int] = []  # signals that came before the child existed: passed on once it does

    def forward(sig: int, _frame: object) -> None:
        if not started:
            early.append(sig)
        for child in started:
            for pid in _main_pids(child.pid, wrapped):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    for sig in FORWARDED:  # a Python handler resets at exec: the rank gets the defaults
        signal.signal(sig, forward)
    uid, gid = opts.get("--uid"), opts.get("--gid")
    try:
        child = subprocess.Popen(
            argv,
            user=int(uid) if uid else None,
            group=int(gid) if gid else None,
            extra_groups=[] if uid else None,
        )
    except OSError as exc:
        print(f"corral: could not launch {argv!r}: {exc}", file=sys.stderr, flush=True)
        code = 127
    else:
        started.append(child)
        for pending in early:
            forward(pending, None)
        while True:
            try:
                returncode = child.wait()
                break
            except InterruptedError:
                continue
        code = 128 - returncode if returncode < 0 else returncode
    tmp = f"{exit_file}.tmp"
    with open(tmp, "w") as out:
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
