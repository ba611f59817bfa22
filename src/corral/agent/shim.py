"""`python -m corral.agent.shim EXIT_FILE [--uid U --gid G] -- ARGV...`: one rank's parent.

The agent starts each rank through this shim (as containerd-shim and slurmstepd sit between a
runtime and its processes): the shim starts ARGV (as the given user), waits for it, and writes its
exit status to EXIT_FILE, so that a restarted agent learns how a rank it did not start ended. The
shim leads the rank's process group; the signals the agent sends the group reach the rank, and
the shim only waits. It imports the standard library only (it starts with every rank).
"""

from __future__ import annotations

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
    for sig in FORWARDED:  # the group's signals are for the rank; a Python handler resets at exec
        signal.signal(sig, lambda *_: None)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
