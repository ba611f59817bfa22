"""Worker logs stay on the node; the agent serves them to the control plane, and only to it.

`GET /logs/<job>/<attempt>/<rank>?offset=N&limit=M` answers up to M bytes of that rank's log from
byte N, with `X-Corral-Size` (the file's size now). Requests carry
`X-Corral-Signature: <unix time>:<HMAC-SHA256 of "<time>:<path and query>">`, keyed with the
SHA-256 of the agent's own token, which the server also holds (it stores token hashes): the
server signs, the agent checks, and no secret crosses the wire. Signatures older than a minute
are refused. Users reach logs through `GET /v1/jobs/{id}/logs`, which applies team authorization
and then asks the node (`corral logs`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from corral.client.signing import HEADER, token_key, valid

log = logging.getLogger("corral.agent")

MAX_CHUNK = 1 << 20
PATH = re.compile(r"^/logs/([A-Za-z0-9_.-]+)/(\d+)/(\d+)$")


def log_path(root: Path, job: str, attempt: int, rank: int) -> Path:
    return root / job / f"attempt-{attempt}" / f"rank-{rank}.log"


class LogServer:
    """A small threaded HTTP server (the standard library's: it serves a few admins' reads, and
    keeps the agent free of an ASGI stack)."""

    def __init__(self, root: Path, token: str, host: str, port: int = 0) -> None:
        key = token_key(token)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _answer(self, status: int, body: bytes, size: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                if size is not None:
                    self.send_header("X-Corral-Size", str(size))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if not valid(key, self.headers.get(HEADER, ""), self.path, time.time()):
                    self._answer(403, b"bad or missing signature\n")
                    return
                url = urlsplit(self.path)
                match = PATH.match(url.path)
                if match is None:
                    self._answer(404, b"no such log\n")
                    return
                query = parse_qs(url.query)
                offset = max(0, int((query.get("offset") or ["0"])[0]))
                limit = min(MAX_CHUNK, max(0, int((query.get("limit") or [str(MAX_CHUNK)])[0])))
                path = log_path(outer.root, match.group(1), int(match.group(2)), int(match.group(3)))
                try:
                    with open(path, "rb") as f:
                        size = f.seek(0, 2)
                        f.seek(min(offset, size))
                        body = f.read(limit)
                except FileNotFoundError:
                    self._answer(404, b"no such log on this node\n")
                    return
                self._answer(200, body, size)

        self.root = root
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://{host if ':' not in host else '[' + host + ']'}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="corral-logs", daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("worker logs served at %s", self.url)

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for serve_forever, which may never have run
            self.httpd.shutdown()
        self.httpd.server_close()
