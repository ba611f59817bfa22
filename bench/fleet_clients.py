"""Which HTTP client can play a fleet: heartbeats per second, and per CPU-second of the client.

Run: `.venv/bin/python bench/fleet_clients.py [--seconds 8] [--concurrency 32]`.

One `corral server` (SQLite) with one registered node; each client sends heartbeats
(`POST /v1/agents/n1/heartbeat`) in a closed loop with `--concurrency` requests in flight for
`--seconds`, in this process: the fleet's own client (`corral.fleet.wire`, asyncio streams,
keep-alive), `httpx.AsyncClient` (keep-alive pool of the same size), and `http.client` in
threads (one keep-alive connection per thread). The server and the client share the machine,
so the figure that does not depend on the machine's load is requests per CPU-second of the
client; requests per second are given too.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server.harness import Server  # noqa: E402

from corral.fleet.stats import percentile  # noqa: E402
from corral.fleet.wire import Pool, auth_headers  # noqa: E402

PATH = "/v1/agents/n1/heartbeat"


def timed(run: Callable[[], list[float]], seconds: float) -> dict[str, float]:
    cpu0, t0 = os.times(), time.monotonic()
    lat = run()
    cpu1, wall = os.times(), time.monotonic() - t0
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {
        "per_s": len(lat) / wall, "per_client_cpu_s": len(lat) / max(cpu, 1e-9),
        "client_cpu_pct": 100 * cpu / wall, "p50_ms": 1000 * percentile(lat, 50),
        "p99_ms": 1000 * percentile(lat, 99),
    }  # fmt: skip


def wire(url: str, token: str, body: dict[str, int], seconds: float, concurrency: int) -> list[float]:
    host, port = url.removeprefix("http://").split(":")

    async def main() -> list[float]:
        pool = Pool(host, int(port), concurrency)
        headers, lat, stop = auth_headers(token), [], time.monotonic() + seconds

        async def loop() -> None:
            while time.monotonic() < stop:
                t = time.perf_counter()
                status, _ = await pool.request("POST", PATH, headers, body)
                assert status == 200
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        pool.close()
        return lat

    return asyncio.run(main())


def httpx_async(url: str, token: str, body: dict[str, int], seconds: float, concurrency: int) -> list[float]:
    import httpx

    async def main() -> list[float]:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"Authorization": f"Bearer {token}"}
        lat: list[float] = []
        stop = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits) as client:

            async def loop() -> None:
                while time.monotonic() < stop:
                    t = time.perf_counter()
                    r = await client.post(PATH, json=body)
                    assert r.status_code == 200
                    lat.append(time.perf_counter() - t)

            await asyncio.gather(*(loop() for _ in range(concurrency)))
        return lat

    return asyncio.run(main())


def threads(url: str, token: str, body: dict[str, int], seconds: float, concurrency: int) -> list[float]:
    host, port = url.removeprefix("http://").split(":")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    data, lat, stop = json.dumps(body), [], time.monotonic() + seconds

    def loop() -> None:
        conn = http.client.HTTPConnection(host, int(port))
        while time.monotonic() < stop:
            t = time.perf_counter()
            conn.request("POST", PATH, data, headers)
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            lat.append(time.perf_counter() - t)
        conn.close()

    workers = [threading.Thread(target=loop) for _ in range(concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return lat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="corral-clients-"))
    server = Server(f"sqlite:///{tmp / 'corral.db'}", tmp / "data", extra=["--allow-dynamic-nodes"])
    server.start()
    try:
        with server.client() as c:
            reg = c.post("/v1/agents/register", json={"node": "n1", "gpus": 8})
            reg.raise_for_status()
        body = {"incarnation": reg.json()["incarnation"]}
        rows = []
        for name, client, conc in (
            ("corral.fleet.wire (asyncio streams)", wire, args.concurrency),
            ("httpx.AsyncClient", httpx_async, args.concurrency),
            ("http.client, one thread per connection", threads, min(args.concurrency, 16)),
        ):
            out = timed(
                lambda c=client, n=conc: c(server.url, server.admin_token, body, args.seconds, n),
                args.seconds,
            )
            rows.append((f"{name}, {conc} in flight", out))
    finally:
        server.stop()
    head = ("req/s", "req/client CPU-s", "client CPU %", "p50 ms", "p99 ms")
    print(f"{'client':55} {head[0]:>7} {head[1]:>17} {head[2]:>13} {head[3]:>7} {head[4]:>7}")
    for name, o in rows:
        print(f"{name:55} {o['per_s']:7.0f} {o['per_client_cpu_s']:17.0f} {o['client_cpu_pct']:13.0f} "
              f"{o['p50_ms']:7.2f} {o['p99_ms']:7.2f}")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
