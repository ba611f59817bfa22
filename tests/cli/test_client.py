"""The client and the command line's pure parts: refusals, exit codes, submit flags, GPU detection."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.agent.inventory import detect_gpus
from corral.cli.remote import exit_code_of, gpu_ranges
from corral.cli.settings import resolve_connection, write_config
from corral.cli.submit_spec import SubmitFlags, apply_flags, load_spec_file, parse_mount
from corral.client import Client, ClientError
from corral.core.errors import ConfigError


def client_answering(status: int, body: Any, seen: list[httpx.Request] | None = None) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    return Client("http://corral.test", "secret", transport=httpx.MockTransport(handle))


def test_a_refusal_carries_the_servers_message_fix_and_code() -> None:
    body = {"error": "this job can never run on this cluster: no node has 16 GPUs", "code": "never_fits"}
    with client_answering(422, body) as c, pytest.raises(ClientError) as caught:
        c.submit({"gpus_per_replica": 16, "command": ["true"]})
    err = caught.value
    assert (err.status, err.code, err.fix) == (422, "never_fits", "")
    assert "no node has 16 GPUs" in str(err)
    assert exit_code_of(err) == 1


def test_unknown_routes_and_non_json_answers_still_say_what_happened() -> None:
    with client_answering(404, {"detail": "Not Found"}) as c, pytest.raises(ClientError) as caught:
        c.job("j1")
    assert caught.value.status == 404 and "GET /v1/jobs/j1: Not Found" in caught.value.message
    with client_answering(502, "<html>Bad Gateway</html>") as c, pytest.raises(ClientError) as caught:
        c.nodes()
    assert "HTTP 502" in caught.value.message and "Bad Gateway" in caught.value.message
    assert exit_code_of(caught.value) == 4


@pytest.mark.parametrize(
    ("status", "code", "exit_code"),
    [(0, "", 4), (401, "", 3), (403, "", 3), (404, "", 3), (409, "", 1), (422, "", 2), (413, "", 2),
     (422, "never_fits", 1), (500, "", 1), (503, "", 4)],
)  # fmt: skip
def test_exit_codes(status: int, code: str, exit_code: int) -> None:
    assert exit_code_of(ClientError(status, "x", code=code)) == exit_code


def test_requests_carry_the_token_filters_and_paging() -> None:
    seen: list[httpx.Request] = []
    with client_answering(200, {"jobs": []}, seen) as c:
        assert c.jobs(state=["pending", "running"], queue="research", after=7) == []
    request = seen[0]
    assert request.headers["authorization"] == "Bearer secret"
    assert request.url.params.get_list("state") == ["pending", "running"]
    assert request.url.params["queue"] == "research" and request.url.params["after"] == "7"


def test_paging_follows_seq_until_a_short_page() -> None:
    pages = {0: [{"id": f"j{i}", "seq": i} for i in range(1, 1001)], 1000: [{"id": "j1001", "seq": 1001}]}

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"jobs": pages[int(request.url.params["after"])]})

    with Client("http://corral.test", transport=httpx.MockTransport(handle)) as c:
        ids = [j["id"] for j in c.iter_jobs()]
    assert len(ids) == 1001 and ids[-1] == "j1001"


def test_an_unreachable_server_says_how_to_start_one() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with (
        Client("http://127.0.0.1:9", transport=httpx.MockTransport(refuse)) as c,
        pytest.raises(ClientError) as caught,
    ):
        c.healthz()
    err = caught.value
    assert err.is_unreachable and "http://127.0.0.1:9 is not reachable (connection refused)" in err.message
    assert "corral up" in err.fix and "corral server" in err.fix
    with pytest.raises(ValueError, match="http://"):
        Client("127.0.0.1:8400")


def test_connection_settings_flags_then_environment_then_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "corral" / "config.json"
    monkeypatch.setenv("CORRAL_CONFIG", str(config))
    monkeypatch.delenv("CORRAL_SERVER", raising=False)
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    assert resolve_connection(None, None) == ("http://127.0.0.1:8400", None)
    write_config({"server": "http://from-config:1", "token": "config-token"})
    assert config.stat().st_mode & 0o777 == 0o600
    assert resolve_connection(None, None) == ("http://from-config:1", "config-token")
    monkeypatch.setenv("CORRAL_SERVER", "http://from-env:2")
    monkeypatch.setenv("CORRAL_TOKEN", "env-token")
    assert resolve_connection(None, None) == ("http://from-env:2", "env-token")
    assert resolve_connection("http://flag:3", "flag-token") == ("http://flag:3", "flag-token")


def test_flags_override_the_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: train\nqueue: research\nreplicas: 2\ngpus_per_replica: 8\n"
        "topology: {pack: leaf, required: true}\nenv: {A: '1', B: '2'}\n"
        "mounts: [{source: /datasets/a, target: /data}]\ncommand: [python, train.py]\n"
    )
    flags = SubmitFlags(
        name="other", gpus_per_replica=4, pack_required=False, priority="1000", gpu_model=("H100*", "A100"),
        env=("B=3=4",), mounts=("/datasets/b:/data:ro", "/scratch:/tmp/s"), checkpoint_grace="90s",
    )  # fmt: skip
    spec = apply_flags(load_spec_file(path), flags)
    assert spec["name"] == "other" and spec["queue"] == "research"
    assert (spec["replicas"], spec["gpus_per_replica"]) == (2, 4)
    assert spec["topology"] == {"pack": "leaf", "required": False}
    assert spec["priority"] == 1000 and spec["gpu_model"] == ["H100*", "A100"]
    assert spec["env"] == {"A": "1", "B": "3=4"}
    assert spec["mounts"] == [
        {"source": "/datasets/b", "target": "/data", "read_only": True},
        {"source": "/scratch", "target": "/tmp/s", "read_only": False},
    ]
    assert spec["checkpoint"] == {"grace": "90s"} and spec["command"] == ["python", "train.py"]
    assert apply_flags(spec, SubmitFlags(command=("sleep", "1")))["command"] == ["sleep", "1"]


def test_malformed_flags_and_files_name_the_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--mount: '/a' is not SOURCE:TARGET\[:ro\]"):
        parse_mount("/a")
    with pytest.raises(ConfigError, match="--env"):
        apply_flags({}, SubmitFlags(env=("NOVALUE",)))
    path = tmp_path / "job.yaml"
    path.write_text("name: x\ntime_limit: 4\n")
    with pytest.raises(ConfigError, match=r"job.yaml:2: time_limit: duration 4 has no unit"):
        load_spec_file(path)


def test_gpu_ranges() -> None:
    assert gpu_ranges([0, 1, 2, 3, 6]) == "0-3,6"
    assert gpu_ranges([5]) == "5" and gpu_ranges([]) == "-"


def fake_nvml(**overrides: Any) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    memory = types.SimpleNamespace(total=80 * 2**30)
    switch = types.SimpleNamespace(busId="00000000:0A:00.0")  # an NVSwitch: the far end of every link

    def link_state(h: int, link: int) -> int:
        if link >= 4:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")  # past the GPU's last link
        return 1

    calls = {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None, "nvmlDeviceGetCount": lambda: 8,
        "nvmlDeviceGetHandleByIndex": lambda i: i, "nvmlDeviceGetName": lambda h: "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetMemoryInfo": lambda h: memory, "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0"),
        "nvmlDeviceGetNvLinkState": link_state, "nvmlDeviceGetNvLinkRemotePciInfo_v2": lambda h, link: switch,
        "NVML_FEATURE_ENABLED": 1,
    }  # fmt: skip
    calls.update(overrides)
    for name, fn in calls.items():
        setattr(module, name, fn)
    return module


def test_gpus_are_detected_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    found = detect_gpus()
    assert (found.count, found.model, found.memory_gib, found.why_none) == (8, "H100-80GB", 80.0, "")
    assert found.uuids == [f"GPU-{i}" for i in range(8)]
    assert found.nvlink == [list(range(8))]  # every GPU reaches the NVSwitch: one domain


def test_no_driver_means_no_gpus_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise RuntimeError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(nvmlInit=no_driver))
    found = detect_gpus()
    assert found.count == 0 and "Driver Not Loaded" in found.why_none
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert detect_gpus().why_none == "nvidia-ml-py is not installed"


def test_json_helpers_print_compact_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from corral.cli.remote import print_json_line

    print_json_line({"seq": 1, "event": "submit"})
    assert capsys.readouterr().out == json.dumps({"seq": 1, "event": "submit"}, separators=(",", ":")) + "\n"


def test_every_command_is_in_the_cli_docs() -> None:
    import typer.main

    from corral.cli.main import app

    docs = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    root = typer.main.get_command(app)
    names = []
    for name, command in getattr(root, "commands", {}).items():
        names.append(name)
        names += [f"{name} {sub}" for sub in getattr(command, "commands", {})]
    missing = [name for name in names if f"corral {name}" not in docs]
    assert missing == []
