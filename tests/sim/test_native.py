"""The compiled core (corral.native): used only for the sources it was built from, and a replay
through it writes the same event log, byte for byte, as the interpreted one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corral import native

REPLAY = """
import sys
from dataclasses import replace
import corral.native
from corral.config.cluster_file import parse_cluster_config
from corral.policies.registry import load_policy
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog, JsonLinesSink
from corral.sim.loaders.philly import load_philly

out, policy = sys.argv[1], sys.argv[2]
jobs = [replace(j, queue=None) for j in load_philly()[:4000]]
nodes = [{"name": "n[01-16]", "gpus": 8, "labels": {"leaf": "l1"}},
         {"name": "m[01-16]", "gpus": 8, "labels": {"leaf": "l2"}}]
cluster = parse_cluster_config({"name": "t", "topology": ["leaf"], "nodes": nodes}, source="test")
sink = JsonLinesSink(out)
Simulation(cluster, jobs, load_policy(policy), EventLog([sink]), SimOptions()).run()
sink.close()
print("compiled" if corral.native.active() else "interpreted")
"""


def _package_copy(tmp_path: Path) -> Path:
    package = tmp_path / "corral"
    for module in native.modules():
        source = native.PACKAGE_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")
        target = package.joinpath(*module.split(".")[1:]).with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return package


def test_a_build_is_used_only_for_the_sources_it_was_built_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    package = _package_copy(tmp_path)
    assert native.current_build(package) is None  # never built
    built = package / ".native" / native.digest(package)
    built.mkdir(parents=True)
    assert native.current_build(package) is None  # a build that did not finish
    (built / "BUILT").write_text("done\n")
    assert native.current_build(package) == built

    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.current_build(package) is None  # turned off
    monkeypatch.delenv(native.PURE_ENV)

    cycle = package / "core" / "cycle.py"
    cycle.write_text(cycle.read_text() + "\n# an edit\n")
    assert native.digest(package) != built.name
    assert native.current_build(package) is None  # stale: the edited source runs interpreted


@pytest.mark.parametrize("policy", ["las", "default"])
def test_the_compiled_core_replays_exactly_as_the_interpreted_one(
    policy: str, traces: Path, tmp_path: Path
) -> None:
    if native.current_build() is None:
        pytest.skip("the core is not compiled here (python -m corral.build_native)")
    logs = {}
    for mode, pure in (("compiled", "0"), ("interpreted", "1")):
        out = tmp_path / f"{mode}.jsonl"
        env = {**os.environ, native.PURE_ENV: pure, "CORRAL_TRACES_DIR": str(traces)}
        run = subprocess.run(
            [sys.executable, "-c", REPLAY, str(out), policy], env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == mode
        logs[mode] = out.read_bytes()
    assert b'"event":"preempt"' in logs["interpreted"] or policy == "default"
    assert logs["compiled"] == logs["interpreted"]


def test_corral_version_says_whether_the_core_is_compiled() -> None:
    def version(pure: str) -> str:
        corral = [sys.executable, "-c", "from corral.cli.main import main; main()", "version"]
        env = {**os.environ, native.PURE_ENV: pure}
        run = subprocess.run(corral, env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert version("1").startswith("0.1.0 (core: interpreted; python -m corral.build_native")
    if native.current_build() is not None:
        assert version("0") == "0.1.0 (core: compiled)"
