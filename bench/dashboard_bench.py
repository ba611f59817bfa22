"""How fast the dashboard draws a big cluster: 1,000 nodes and 10,000 jobs, in a real browser.

Run: `.venv/bin/python bench/dashboard_bench.py [--nodes 1000] [--jobs 10000] [--runs 5] [--json OUT]
[--screenshot PNG]`.

It writes a cluster file (4 spines x 10 leaves, 25 nodes of 8 GPUs per leaf, half of them with
two NVLink domains of 4; four queues), starts a real `corral server` on SQLite, registers every
node through the agents' API (admin token; heartbeats keep them up), cordons and drains a few,
and submits `--jobs` jobs of 1 to 8 GPUs (mostly 1 and 2), of which the scheduler starts as many
as fit: the rest stay pending. Then Debian's Chromium (Playwright) opens the Cluster page
`--runs` times in a fresh tab and reads, from the page's own clock (`performance.now()`, from
the start of the navigation):

- `first draw`: until the map is in the DOM and laid out, the API calls included
  (`/v1/config`, `/v1/nodes`, `/v1/queues`, the live jobs);
- `painted`: until two frames later, when the browser has painted it;
- `render`: building and laying out the map alone (`ClusterMap.render`: one HTML string, one
  `innerHTML`, a forced layout), without the API calls;
- `recolour`: switching colour-by queue/job, which redraws every node's tile in place;

and, once, the Jobs page's first page of 50 jobs (newest first) and the sizes and times of the
API answers the page needs. Medians over the runs; wall-clock on a shared machine (the load
average is printed). docs/benchmarks.md records results.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server.harness import Server  # noqa: E402
from tests.web.conftest import CHROMIUM, LAUNCH_ARGS  # noqa: E402

SPINES, LEAVES = 4, 10


def cluster_file(path: Path, nodes: int) -> list[str]:
    per_leaf = max(1, nodes // (SPINES * LEAVES))
    lines = ["name: bench", "topology: [spine, leaf]", "nodes:"]
    names: list[str] = []
    for s in range(SPINES):
        for leaf in range(LEAVES):
            first = len(names) + 1
            last = min(nodes, first + per_leaf - 1) if (s, leaf) != (SPINES - 1, LEAVES - 1) else nodes
            if first > last:
                continue
            nvlink = "[[0, 1, 2, 3], [4, 5, 6, 7]]" if leaf % 2 else "all"
            lines += [
                f"  - name: n[{first:04d}-{last:04d}]",
                "    gpus: 8",
                "    gpu_model: H100-80GB",
                f"    nvlink: {nvlink}",
                f"    labels: {{spine: s{s + 1}, leaf: l{s + 1}-{leaf + 1}}}",
            ]
            names += [f"n{i:04d}" for i in range(first, last + 1)]
    lines += [
        "queues:",
        "  - {name: research, weight: 3, quota: 3000, limit: 8000, cohort: main}",
        "  - {name: prod, weight: 2, quota: 2000, limit: 8000, cohort: main}",
        "  - {name: vision, weight: 1, quota: 1000, limit: 8000, cohort: main}",
        "  - {name: batch, weight: 1, quota: 0, limit: 8000}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return names


class Http:
    """One keep-alive connection per thread, with the admin token."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.local = threading.local()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, float, int]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        for attempt in (1, 2):  # the server closes idle keep-alive connections: open a new one
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            try:
                started = time.perf_counter()
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                took = time.perf_counter() - started
                return response.status, json.loads(raw) if raw else None, took, len(raw)
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def populate(api: Http, names: list[str], jobs: int, stop: threading.Event, seed: int = 7) -> None:
    """Register every node and keep it up (heartbeats), cordon and drain a few, submit `jobs` jobs."""
    incarnations: dict[str, int] = {}

    def register(name: str) -> None:
        status, out, _, _ = api.call(
            "POST", "/v1/agents/register", {"node": name, "gpus": 8, "gpu_model": "H100-80GB"}
        )
        assert status == 200, out
        incarnations[name] = out["incarnation"]

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(register, names))
    threading.Thread(target=heartbeats, args=(api, incarnations, stop), daemon=True).start()
    for name in names[5:15]:
        api.call("POST", f"/v1/nodes/{name}/cordon", {"reason": "bench"})
    for name in names[15:20]:
        api.call("POST", f"/v1/nodes/{name}/drain", {"deadline": 3600, "reason": "bench"})
    rng = random.Random(seed)
    queues = ["research", "prod", "vision", "batch"]

    def submit(i: int) -> None:
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
        spec = {
            "name": f"job-{i}",
            "queue": queues[i % 4],
            "gpus_per_replica": gpus,
            "command": ["sleep", "3600"],
        }
        status, out, _, _ = api.call("POST", "/v1/jobs", spec)
        assert status == 201, out

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(submit, range(jobs)))


def heartbeats(api: Http, incarnations: dict[str, int], stop: threading.Event) -> None:
    """Every node's heartbeat every 5 s, as its agent would send it (a silent node is declared lost)."""
    while not stop.wait(5.0):
        with ThreadPoolExecutor(4) as pool:
            list(
                pool.map(
                    lambda n: api.call("POST", f"/v1/agents/{n}/heartbeat", {"incarnation": incarnations[n]}),
                    incarnations,
                )
            )


def settle(api: Http, timeout: float = 120.0) -> int:
    """Wait until the scheduler stops starting jobs; returns the GPUs allocated."""
    last, same_since, deadline = -1, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, out, _, _ = api.call("GET", "/v1/nodes")
        allocated = sum(n["allocated"] for n in out["nodes"])
        if allocated != last:
            last, same_since = allocated, time.monotonic()
        elif time.monotonic() - same_since > 6.0:
            return allocated
        time.sleep(0.5)
    return last


def measure_pages(url: str, token: str, runs: int, screenshot: Path | None) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    figures: dict[str, list[float]] = {
        "first_draw_ms": [],
        "painted_ms": [],
        "render_ms": [],
        "recolour_ms": [],
    }
    out: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        for _ in range(runs):
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            context.add_init_script(f"sessionStorage.setItem('corral.token', {json.dumps(token)})")
            page = context.new_page()
            page.goto(url + "/#/cluster")
            page.wait_for_selector("#map[data-rendered]", timeout=120_000)
            page.wait_for_function("window.__corral.clusterPaintedAt !== undefined", timeout=60_000)
            seen = page.evaluate("window.__corral")
            if screenshot is not None and not figures["render_ms"]:
                page.screenshot(path=str(screenshot))  # the first screen: tiles off it are drawn on scroll
            figures["first_draw_ms"].append(seen["clusterRenderedAt"])
            figures["painted_ms"].append(seen["clusterPaintedAt"])
            figures["render_ms"].append(seen["clusterRenderMs"])
            page.click('[data-mode="job"]')
            figures["recolour_ms"].append(page.evaluate("window.__corral.recolourMs"))
            out["tiles"] = page.locator("#map .node").count()
            out["gpu_cells"] = page.locator("#map .node i").count()
            if "jobs_page_ms" not in out:
                started = page.evaluate("performance.now()")
                page.click('#nav a[data-page="jobs"]')
                page.wait_for_selector("table.jobs tbody tr")
                out["jobs_page_ms"] = round(page.evaluate("performance.now()") - started, 1)
                out["jobs_rows"] = page.locator("table.jobs tbody tr").count()
            context.close()
        browser.close()
    for key, values in figures.items():
        out[key] = round(statistics.median(values), 1)
        out[key.replace("_ms", "_all_ms")] = [round(v, 1) for v in values]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--screenshot", type=Path, help="save the cluster page (first screen) here")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        names = cluster_file(base / "cluster.yaml", args.nodes)
        server = Server(f"sqlite:///{base / 'corral.db'}", base / "data", base / "cluster.yaml")
        server.start(timeout=120)
        stop = threading.Event()
        try:
            api = Http(server.port, server.admin_token)
            started = time.monotonic()
            populate(api, names, args.jobs, stop)
            allocated = settle(api)
            print(f"populated in {time.monotonic() - started:.1f}s: {len(names)} nodes, {args.jobs} jobs, "
                  f"{allocated} GPUs allocated", file=sys.stderr)  # fmt: skip
            sizes = {}
            for label, path in (
                ("nodes", "/v1/nodes"),
                ("live_jobs", "/v1/jobs?state=starting&state=running&state=stopping&limit=10000"),
                ("jobs_page", "/v1/jobs?limit=51&before=9007199254740991"),
                ("series_1h", "/v1/usage/series?span=3600&points=120"),
            ):
                _, body, took, size = api.call("GET", path)
                sizes[label] = {"ms": round(took * 1000, 1), "kib": round(size / 1024, 1)}
                for key in ("nodes", "jobs"):
                    if isinstance(body, dict) and isinstance(body.get(key), list):
                        sizes[label]["rows"] = len(body[key])
            figures = measure_pages(server.url, server.admin_token, args.runs, args.screenshot)
        finally:
            stop.set()
            server.stop()
    result = {
        "nodes": len(names),
        "jobs": args.jobs,
        "gpus_allocated": allocated,
        **figures,
        "api": sizes,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
