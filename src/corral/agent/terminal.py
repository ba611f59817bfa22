"""A shell inside a running attempt, on a pseudo-terminal, carried to the server over a WebSocket.

The server orders a session through the node's outbox (`kind: terminal`, after it checked the
user's right to the job: `corral.server.api_terminal`); the agent then opens its own WebSocket to
the server with its node's token (agents make outbound connections only) and relays the pty.
The shell starts like a rank (`corral.agent.shim`, `"tty": true`): as the job's run-as user,
never the agent's (`sandbox.user_of`: root only on a node that allows root jobs), in the
attempt's cgroups, behind its bind mounts, in its working directory, with the environment the
rank got (`launch.workers`: `CUDA_VISIBLE_DEVICES`, `RANK`, ... over the allowlist of
`launch.base_env`) and the user's `TERM`. Binary frames are keystrokes and output; text frames
are JSON: `resize` in, `exit` (the shell's status) and `error` out. When the user goes away the
shell is hung up; a session ordered with `end` (an allocation's, `corral alloc`) writes
`allocation-ended` into the attempt's control folder when the shell ends, which ends the
allocation's holder (`HOLDER`), so the job finishes and its GPUs are freed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
from typing import TYPE_CHECKING, Any

from corral.agent import files
from corral.agent.launch import base_env, workers
from corral.agent.sandbox import SetupError, preexec, user_of, wrap

if TYPE_CHECKING:
    from corral.agent.attempt import Attempt
    from corral.agent.runner import Agent

log = logging.getLogger("corral.agent")

ENDED = "allocation-ended"  # in an attempt's control folder: its allocation's shell has ended
# an allocation's one process: waits, holding the GPUs, until its shell has ended
HOLDER = ["/bin/sh", "-c", f'while [ ! -e "$CORRAL_CONTROL_DIR/{ENDED}" ]; do sleep 1; done']
HANGUP_WAIT = 5.0  # a hung-up shell that has not ended after this long is killed
SESSION = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
NOT_SHELLS = ("nologin", "false")


def open_session(agent: Agent, order: dict[str, Any]) -> None:
    """Serve one `terminal` order in its own thread."""
    threading.Thread(
        target=_serve, args=(agent, order), name=f"terminal-{order.get('job')}", daemon=True
    ).start()


def _serve(agent: Agent, order: dict[str, Any]) -> None:
    from websockets.exceptions import WebSocketException
    from websockets.sync.client import connect

    session = str(order.get("session") or "")
    if not SESSION.match(session):
        log.warning("terminal order with a malformed session id: ignored")
        return
    # the replica whose long poll carried the order (one of several addresses: client/failover.py)
    base = agent.poller.server
    url = base.replace("http", "ws", 1).rstrip("/") + f"/v1/agents/{agent.node}/terminals/{session}"
    try:
        with connect(
            url, additional_headers={"Authorization": f"Bearer {agent.token}"}, open_timeout=10
        ) as ws:
            _session(agent, order, ws)
    except (OSError, WebSocketException) as exc:
        log.warning("terminal %s of job %s: %s", session[:8], order.get("job"), exc)


def _session(agent: Agent, order: dict[str, Any], ws: Any) -> None:
    from websockets.exceptions import WebSocketException

    session = str(order["session"])
    try:
        shell = Shell(agent, order)
    except (SetupError, OSError) as exc:
        ws.send(json.dumps({"type": "error", "message": f"no shell on {agent.node}: {exc}"}))
        return
    log.info("terminal %s: a shell in job %s rank %s", session[:8], shell.run.job, shell.rank)
    code = shell.relay(ws)
    with contextlib.suppress(WebSocketException, OSError):
        ws.send(json.dumps({"type": "exit", "code": code}))
    log.info("terminal %s: ended with %s", session[:8], code)


def shell_of(shell: str) -> str:
    """The user's login shell, unless it is none (nologin, false): then bash, else sh."""
    if shell and os.access(shell, os.X_OK) and not shell.endswith(NOT_SHELLS):
        return shell
    return "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"


class Shell:
    """The shell's shim on a fresh pty, started in the attempt's sandbox."""

    def __init__(self, agent: Agent, order: dict[str, Any]) -> None:
        from corral.agent.ranks import SHIM, SHIM_ENV, Identity

        key = (str(order["job"]), int(order["attempt"]))
        with agent._lock:
            run = agent.attempts.get(key)
        if run is None or not run.procs:
            raise SetupError(f"job {key[0]} attempt {key[1]} is not running on node {agent.node}")
        self.run: Attempt = run
        self.rank = int(order.get("rank") or 0)
        self.end = bool(order.get("end"))
        who = Identity(user_of(agent.caps, str(run.order.get("run_as") or "")))
        spec = run.order["spec"]
        found = workers(run.order, agent.node, run.checkpoints, run.run_dir / "hostfile", run.run_dir)
        if not found:
            raise SetupError(f"job {key[0]} has no rank on node {agent.node}")
        worker = next((w for w in found if w.rank == self.rank), found[0])
        env = {**base_env(os.environ, who.home, who.name, who.shell, agent.pass_env), **worker.env}
        env["TERM"] = str(order.get("term") or "xterm")
        cwd = str(spec.get("working_dir") or run.run_dir / "work")
        mounts = [dict(m) for m in spec.get("mounts") or []]
        name = f"terminal-{order['session']}"
        launch = run.run_dir / f"{name}.launch"
        body = {
            "exit_file": str(run.run_dir / f"{name}.exit"),
            "argv": wrap(agent.caps, [shell_of(who.shell)], mounts, cwd),
            "env": env,
            "cwd": "/" if mounts else cwd,
            "uid": who.uid,
            "gid": who.gid,
            "tty": True,
        }
        files.write_file(launch, json.dumps(body).encode())
        self.master, slave = os.openpty()
        resize(slave, int(order.get("rows") or 24), int(order.get("cols") or 80))
        fds = run.group.entry_fds() if run.group is not None else []
        try:
            if run.group is not None and len(fds) < len(run.group.paths):  # never outside its cgroups
                raise SetupError(f"job {key[0]} attempt {key[1]} is ending on node {agent.node}")
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", SHIM, str(launch)],
                env=SHIM_ENV,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                cwd="/",
                preexec_fn=preexec(fds) if fds else None,
            )
        except BaseException:
            os.close(self.master)
            with contextlib.suppress(OSError):
                launch.unlink()  # it holds the job's environment
            raise
        finally:
            os.close(slave)
            for fd in fds:
                os.close(fd)
        self.exit_file = run.run_dir / f"{name}.exit"

    def relay(self, ws: Any) -> int:
        """Relay until the shell ends (its status) or the user goes away (hang-up, then its status)."""
        reader = threading.Thread(target=self._input, args=(ws,), daemon=True)
        reader.start()
        try:
            self._output(ws)
            code = self._wait()
        finally:
            os.close(self.master)
            with contextlib.suppress(OSError):
                self.exit_file.unlink()
            if self.end:
                with contextlib.suppress(OSError, files.UnsafePath):
                    files.write_file(self.run.run_dir / ENDED, b"ended\n", files.READABLE_FILE)
        return code

    def _output(self, ws: Any) -> None:
        from websockets.exceptions import WebSocketException

        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(self.master, 1 << 15)
                except OSError:  # EIO: every process holding the terminal has closed it
                    return
                if not data:
                    return
                try:
                    ws.send(data)
                except (WebSocketException, OSError):
                    self._hang_up()
                    return
            elif self.proc.poll() is not None:
                return  # the shell has ended (what it left in the background keeps the pty open)

    def _input(self, ws: Any) -> None:
        from websockets.exceptions import WebSocketException

        try:
            for message in ws:
                if isinstance(message, bytes):
                    os.write(self.master, message)
                    continue
                with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                    said = json.loads(message)
                    if said.get("type") == "resize":
                        resize(self.master, int(said["rows"]), int(said["cols"]))
        except (WebSocketException, OSError):
            pass
        if self.proc.poll() is None:
            self._hang_up()

    def _hang_up(self) -> None:
        """The user has gone: SIGHUP to the shell (through its shim), as a closed terminal does."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.proc.pid, signal.SIGHUP)

    def _wait(self) -> int:
        try:
            code = self.proc.wait(HANGUP_WAIT) if self.proc.poll() is None else self.proc.returncode
        except subprocess.TimeoutExpired:
            for pid in _children(self.proc.pid):  # the shell's own session and group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            code = self.proc.wait()
        return code if code >= 0 else 128 - code


def resize(fd: int, rows: int, cols: int) -> None:
    """Set the terminal's size (the kernel tells its foreground job with SIGWINCH)."""
    rows, cols = max(1, min(rows, 1000)), max(1, min(cols, 1000))
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as found:
            return [int(p) for p in found.read().split()]
    except OSError:
        return []
