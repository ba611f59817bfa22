"""GPUs: NVLink domains from the links NVML reports (a pure function: no GPU here), and the
per-GPU view and metrics the control plane builds from heartbeats (`corral nodes --gpus`)."""

from __future__ import annotations

import os
import subprocess

from corral.agent.nvml import Device, nvlink_domains
from tests.agent.conftest import CLI
from tests.server.harness import FakeAgent, Server, wait_for


def gpu(index: int, bus: str, *links: str) -> Device:
    return Device(index, f"GPU-{index}", "NVIDIA H100 80GB HBM3", 80 << 30, bus, frozenset(links))


def test_direct_links_make_domains_and_unlinked_gpus_make_none() -> None:
    # two pairs bridged with NVLink (PCIe cards), as NVML spells bus ids in two widths
    devices = [
        gpu(0, "00000000:17:00.0", "0000:18:00.0"),
        gpu(1, "00000000:18:00.0", "00000000:17:00.0"),
        gpu(2, "00000000:65:00.0", "00000000:66:00.0"),
        gpu(3, "00000000:66:00.0", "00000000:65:00.0"),
        gpu(4, "00000000:B1:00.0"),
    ]
    assert nvlink_domains(devices) == [[0, 1], [2, 3]]


def test_gpus_behind_nvswitches_are_one_domain() -> None:
    # HGX: each GPU's links end at NVSwitches (bus ids that are no GPU of the node)
    switches = [f"00000000:0{i}:00.0" for i in range(4)]
    devices = [
        gpu(i, f"00000000:{0x18 + i:02X}:00.0", switches[i % 4], switches[(i + 1) % 4]) for i in range(8)
    ]
    assert nvlink_domains(devices) == [list(range(8))]
    assert nvlink_domains([gpu(0, "00000000:18:00.0")]) == []


def test_nodes_show_each_gpu_with_its_job_and_nvml_figures(server: Server) -> None:
    node = FakeAgent(server, "dgx01", 8, "H100-80GB")
    node.register()
    samples = [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "utilization": i / 10,
            "memory_used_bytes": i << 30,
            "memory_total_bytes": 80 << 30,
        }
        for i in range(8)
    ]
    r = node.http.post("/v1/agents/dgx01/heartbeat", json={"incarnation": node.incarnation, "gpus": samples})
    assert r.status_code == 200, r.text
    with server.client() as c:
        sub = c.post("/v1/jobs", json={"queue": "research", "gpus_per_replica": 2, "command": ["true"]})
        job_id = sub.json()["id"]
    orders = wait_for(lambda: node.orders(wait=2), timeout=15)
    held = orders[0]["placement"][0]["gpus"]

    with server.client() as c:
        nodes = c.get("/v1/nodes", params={"gpus": "true"}).json()["nodes"]
        metrics = c.get("/metrics").text
    gpus = {g["index"]: g for g in next(n for n in nodes if n["name"] == "dgx01")["gpu_list"]}
    for i in range(8):
        assert gpus[i]["uuid"] == f"GPU-{i}" and gpus[i]["utilization"] == i / 10
        if i in held:
            assert gpus[i]["state"] == "allocated" and gpus[i]["job"] == job_id, gpus[i]
            assert gpus[i]["queue"] == "research" and gpus[i]["attempt"] == 1
        else:
            assert gpus[i]["state"] == "free" and "job" not in gpus[i]
    dgx02 = next(n for n in nodes if n["name"] == "dgx02")  # declared, its agent never came
    assert dgx02["state"] != "up" and {g["state"] for g in dgx02["gpu_list"]} == {dgx02["state"]}

    g = held[0]
    assert (
        f'corral_gpu_allocated{{Hostname="dgx01",UUID="GPU-{g}",gpu="{g}",'
        f'job="{job_id}",queue="research"}} 1.0' in metrics
    )
    assert f'corral_gpu_utilization_ratio{{Hostname="dgx01",UUID="GPU-{g}",gpu="{g}"}} {g / 10}' in metrics
    mean = sum(i / 10 for i in held) / len(held)
    assert f'corral_job_gpu_utilization_ratio{{job="{job_id}",queue="research"}} {mean}' in metrics

    stranger = server.token("eve", "member", team="prod")
    with server.client(stranger) as c:
        seen = c.get("/v1/nodes", params={"gpus": "true"}).json()["nodes"]
    theirs = next(n for n in seen if n["name"] == "dgx01")["gpu_list"][held[0]]
    assert theirs["state"] == "allocated" and theirs["job"] is None and "user" not in theirs

    env = {**os.environ, "CORRAL_SERVER": server.url, "CORRAL_TOKEN": server.admin_token}
    table = subprocess.run([*CLI, "nodes", "--gpus"], env=env, capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    line = next(row for row in table.stdout.splitlines() if row.split()[:2] == ["dgx01", str(g)])
    assert job_id in line and "research" in line and f"{g * 10}%" in line, line
    node.close()
