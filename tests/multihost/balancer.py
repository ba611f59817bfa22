"""A TCP load balancer with failover, run inside its own namespace: what operators put in front of
several `corral server` replicas (docs/runbook.md, High availability). Each new connection goes to
the backend that answered last, else to the next that accepts a connection within a second.
It listens on TCP (for the agents) and on a Unix socket (for the tests, outside the namespaces).

Usage: python balancer.py HOST PORT SOCKET BACKEND_HOST:PORT...
"""

from __future__ import annotations

import asyncio
import sys

from relay import pipe  # run as a script: its folder is on sys.path

CONNECT_TIMEOUT = 1.0


async def main(host: str, port: int, path: str, backends: list[tuple[str, int]]) -> None:
    preferred = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal preferred
        for k in range(len(backends)):
            index = (preferred + k) % len(backends)
            try:
                up = await asyncio.wait_for(asyncio.open_connection(*backends[index]), CONNECT_TIMEOUT)
            except (OSError, TimeoutError):
                continue
            preferred = index
            await asyncio.gather(pipe(reader, up[1]), pipe(up[0], writer))
            return
        writer.close()

    tcp = await asyncio.start_server(serve, host, port)
    unix = await asyncio.start_unix_server(serve, path=path)
    print("balancer ready", flush=True)
    async with tcp, unix:
        await asyncio.gather(tcp.serve_forever(), unix.serve_forever())


if __name__ == "__main__":
    pairs = [(b.rsplit(":", 1)[0], int(b.rsplit(":", 1)[1])) for b in sys.argv[4:]]
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], pairs))
