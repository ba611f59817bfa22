"""A small HTTP/1.1 client on asyncio streams: keep-alive connections and a pool of them.

The fleet needs thousands of requests a second from one process, which `httpx.AsyncClient`
does not reach (about 220 a second here, docs/benchmarks.md): this client does only what the
Corral API needs (JSON bodies, `Content-Length` or chunked answers, keep-alive) and nothing
else, so a request costs one write and two reads on the event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

Answer = tuple[int, Any]  # HTTP status, decoded JSON body (None when empty)


class WireError(Exception):
    """No HTTP answer came back (the connection failed or the server closed it mid-answer)."""


class Conn:
    """One keep-alive connection; one request at a time. A request on a connection the server
    closed while idle (uvicorn closes them after 5 s) is sent again once on a new connection."""

    def __init__(self, host: str, port: int, timeout: float = 120.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.opened = 0  # connections made so far (reconnects show here)

    async def request(self, method: str, path: str, headers: bytes, body: Any = None) -> Answer:
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(data)}\r\n".encode()
            + headers
            + b"\r\n"
        )
        for attempt in (1, 2):
            fresh = self.writer is None
            if fresh:
                await self._open()
            assert self.reader is not None and self.writer is not None
            try:
                self.writer.write(head + data)
                return await asyncio.wait_for(self._answer(self.reader), self.timeout)
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                self.close()
                if fresh or attempt == 2 or isinstance(exc, TimeoutError):
                    raise WireError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")

    async def _open(self) -> None:
        try:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        except OSError as exc:
            raise WireError(f"connect to {self.host}:{self.port}: {exc}") from None
        self.opened += 1

    async def _answer(self, reader: asyncio.StreamReader) -> Answer:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, chunked, close = 0, False, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif name == "connection":
                close = value.strip().lower() == "close"
        data = await _chunked(reader) if chunked else await reader.readexactly(length)
        if close:
            self.close()
        return status, json.loads(data) if data else None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


class Pool:
    """`size` keep-alive connections shared by many callers; a caller waits for a free one."""

    def __init__(self, host: str, port: int, size: int) -> None:
        self.conns = [Conn(host, port) for _ in range(size)]
        self.idle: asyncio.Queue[Conn] = asyncio.Queue()
        for conn in self.conns:
            self.idle.put_nowait(conn)

    async def request(self, method: str, path: str, headers: bytes, body: Any = None) -> Answer:
        conn = await self.idle.get()
        try:
            return await conn.request(method, path, headers, body)
        finally:
            self.idle.put_nowait(conn)

    @property
    def opened(self) -> int:
        return sum(c.opened for c in self.conns)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def split_url(url: str) -> tuple[str, int]:
    """`http://host:port` -> (host, port); only plain HTTP (the fleet runs beside the server)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url}: the fleet speaks plain HTTP to a server it can reach (http://host:port)")
    return parts.hostname, parts.port or 80


def auth_headers(token: str) -> bytes:
    return f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n".encode()
