"""examples/train_with_checkpoints.py keeps the checkpoint contract: stopped by its checkpoint
signal it saves and exits 0; the next attempt resumes where it stopped and finishes correctly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_with_checkpoints.py"


def test_the_example_job_stops_on_request_and_resumes(tmp_path: Path) -> None:
    def run(attempt: int) -> subprocess.Popen[str]:
        env = {**os.environ, "CORRAL_CHECKPOINT_DIR": str(tmp_path), "CORRAL_ATTEMPT": str(attempt)}
        args = [sys.executable, str(EXAMPLE), "--steps", "40", "--every", "1000", "--step-seconds", "0.02"]
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)

    first = run(1)
    time.sleep(0.4)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=10)
    assert first.returncode == 0 and "stopping on request" in out, out
    stopped = int(out.split("checkpoint at step ")[1].split()[0])
    assert 0 < stopped < 40

    second = run(2)
    out, _ = second.communicate(timeout=20)
    assert f"resuming at step {stopped}" in out, out
    assert out.strip().endswith(f"done: {sum(range(41))}")  # no step lost or repeated
