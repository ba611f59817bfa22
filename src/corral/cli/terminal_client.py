"""The user's end of the terminal channel (`corral alloc`, `corral attach`): the local terminal in
raw mode, relayed over an authenticated WebSocket to a shell inside a job
(`corral.server.api_terminal`). Keystrokes (Ctrl-C included) go to the remote terminal as bytes,
window changes (SIGWINCH) as `resize` messages; the shell's exit status is returned."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import termios
import threading
import tty
from typing import Any
from urllib.parse import urlencode

from corral.client import ClientError
from corral.client.failover import parse_servers

MAX_SIZE = 1 << 16


def _refusal(exc: Any) -> ClientError:
    """The server's refusal of the WebSocket (its JSON error body) as a ClientError."""
    status = int(exc.response.status_code)
    try:
        body = json.loads(exc.response.body or b"{}")
    except ValueError:
        body = {}
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return ClientError(status, body["error"], str(body.get("fix") or ""))
    return ClientError(status, f"the server refused the terminal (HTTP {status})")


def _size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
        return size.lines, size.columns
    except OSError:
        return 24, 80


def _unreachable(server: str, exc: Exception) -> ClientError:
    return ClientError(0, f"cannot open a terminal at {server}: {exc}", "is the server running?")


def open_terminal(server: str, token: str, job_id: str, rank: int = 0, end: bool = False) -> int:
    """A shell inside `job_id` on rank `rank`'s node until it exits; its exit status. `end`: the
    job is an allocation that ends with this shell. ClientError when the server refuses."""
    from websockets.exceptions import InvalidStatus, WebSocketException
    from websockets.sync.client import connect

    rows, cols = _size()
    query = {"rank": rank, "rows": rows, "cols": cols, "term": os.environ.get("TERM") or "xterm"}
    if end:
        query["end"] = 1
    headers = {"Authorization": f"Bearer {token}"}
    urls = parse_servers(server)  # several replicas: the first that takes the connection
    for n, base in enumerate(urls):
        url = base.replace("http", "ws", 1) + f"/v1/jobs/{job_id}/terminal?" + urlencode(query)
        try:
            ws = connect(url, additional_headers=headers, max_size=MAX_SIZE)
        except InvalidStatus as exc:
            raise _refusal(exc) from None
        except (OSError, WebSocketException) as exc:
            if n + 1 < len(urls):
                continue
            raise _unreachable(base, exc) from None
        try:
            with ws:
                return _relay(ws)
        except (OSError, WebSocketException) as exc:
            raise _unreachable(base, exc) from None
    raise AssertionError("unreachable: parse_servers returns at least one URL")


class _Relay:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.done = threading.Event()
        self.code = 1

    def output(self) -> None:
        """The shell's output to stdout; its exit status, or an error, from text messages."""
        from websockets.exceptions import WebSocketException

        out = sys.stdout.fileno()
        try:
            for message in self.ws:
                if isinstance(message, bytes):
                    os.write(out, message)
                    continue
                said = json.loads(message)
                if said.get("type") == "exit":
                    self.code = int(said.get("code", 1))
                elif said.get("type") == "error":
                    os.write(2, f"corral: {said.get('message')}\r\n".encode())
        except (WebSocketException, OSError, ValueError):
            pass
        finally:
            self.done.set()

    def input(self, winch: int) -> None:
        """Keystrokes to the shell, and the window's size when it changes (`winch` becomes readable
        at each SIGWINCH: a resize is sent before keystrokes typed after it), until the shell ends."""
        stdin = sys.stdin.fileno()
        watched = [winch, stdin]
        while not self.done.is_set():
            ready = select.select(watched, [], [], 0.1)[0]
            if winch in ready:
                with contextlib.suppress(OSError):
                    os.read(winch, 512)
                rows, cols = _size()
                self._send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))
            if stdin in ready:
                data = os.read(stdin, 4096)
                if data:
                    self._send(data)
                else:
                    watched = [winch]  # stdin ended: the shell goes on until it exits

    def _send(self, message: bytes | str) -> None:
        with contextlib.suppress(Exception):
            self.ws.send(message)


def _relay(ws: Any) -> int:
    relay = _Relay(ws)
    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    winch, wake = os.pipe()
    for fd in (winch, wake):
        os.set_blocking(fd, False)
    previous = signal.signal(signal.SIGWINCH, lambda _sig, _frame: None)
    old_wake = signal.set_wakeup_fd(wake)  # written at delivery, whichever thread takes the signal
    reader = threading.Thread(target=relay.output, daemon=True)
    try:
        if saved is not None:
            tty.setraw(stdin)
        reader.start()
        relay.input(winch)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        signal.set_wakeup_fd(old_wake)
        signal.signal(signal.SIGWINCH, previous)
        os.close(winch)
        os.close(wake)
    reader.join(5.0)
    return relay.code
