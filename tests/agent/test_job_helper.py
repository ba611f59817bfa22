"""`corral.job`, the checkpoint contract from inside a worker (DESIGN.md 4.4), in real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LOOP = """
import sys, time
from corral import job
print("ready", flush=True)
while not job.checkpoint_requested():
    time.sleep(0.01)
job.record_checkpoint(7)
print("saved", job.checkpoint_dir(), flush=True)
"""


def env(tmp_path: Path, attempt: int, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "CORRAL_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "CORRAL_ATTEMPT": str(attempt),
        "CORRAL_CONTROL_DIR": str(tmp_path / "control"),
        **extra,
    }


def run_until_ready(tmp_path: Path, attempt: int, **extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LOOP], env=env(tmp_path, attempt, **extra), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_checkpoint_signal_sets_the_flag_instead_of_killing(tmp_path: Path) -> None:
    proc = run_until_ready(tmp_path, 1, CORRAL_CHECKPOINT_SIGNAL="SIGUSR1")
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert f"saved {tmp_path / 'ckpt' / 'attempt-1'}" in out
    assert (tmp_path / "ckpt" / "attempt-1" / "corral-checkpoint.json").exists()


def test_the_request_file_reaches_a_process_that_got_no_signal(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    proc = run_until_ready(tmp_path, 1)
    time.sleep(0.05)
    assert proc.poll() is None
    (tmp_path / "control" / "checkpoint-requested").write_text("preempted\n")
    _, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_resume_takes_the_highest_step_of_an_earlier_attempt_only(tmp_path: Path) -> None:
    code = (
        "from corral import job; import sys; "
        "[job.record_checkpoint(int(a)) for a in sys.argv[1:]]; "
        "print(job.resume_dir(), job.resume_step())"
    )

    def run(attempt: int, *steps: int) -> str:
        args = [sys.executable, "-c", code, *map(str, steps)]
        return subprocess.run(
            args, env=env(tmp_path, attempt), capture_output=True, text=True, check=True
        ).stdout

    assert run(1, 3).split() == ["None", "None"]
    assert run(2, 9).split() == [str(tmp_path / "ckpt" / "attempt-1"), "3"]
    assert run(3).split() == [str(tmp_path / "ckpt" / "attempt-2"), "9"]
    # attempt 3 reads attempt 2; attempt 2 never sees its own or a later folder
    assert run(2).split() == [str(tmp_path / "ckpt" / "attempt-1"), "3"]


def test_a_bad_step_is_refused(tmp_path: Path) -> None:
    code = "from corral import job; job.record_checkpoint(-1)"
    out = subprocess.run([sys.executable, "-c", code], env=env(tmp_path, 1), capture_output=True, text=True)
    assert out.returncode == 1
    assert "step must be a whole number >= 0" in out.stderr


GANG_STEPS = (
    "from corral import job; import sys; "
    "[job.record_checkpoint(int(a.rstrip('w')), whole=a.endswith('w')) for a in sys.argv[1:]]; "
    "print(job.resume_dir(), job.resume_step())"
)


def test_a_gang_step_is_complete_when_every_rank_recorded_it(tmp_path: Path) -> None:
    def run(attempt: int, rank: int, *steps: str) -> list[str]:
        args = [sys.executable, "-c", GANG_STEPS, *steps]
        extra = {"RANK": str(rank), "WORLD_SIZE": "2"}
        return subprocess.run(
            args, env=env(tmp_path, attempt, **extra), capture_output=True, text=True, check=True
        ).stdout.split()

    run(1, 1, "10", "20")
    run(1, 0, "10", "20", "36")  # the last to write; rank 1 never recorded 36
    attempt_1 = str(tmp_path / "ckpt" / "attempt-1")
    assert run(2, 0) == run(2, 1) == [attempt_1, "20"]
    run(2, 1, "30")
    run(2, 0, "40")  # attempt 2: rank 0 recorded 40, rank 1 only 30: nothing complete there yet
    assert run(3, 1) == [attempt_1, "20"]
    run(2, 0, "44w")  # rank 0 wrote all of step 44 (a replicated model)
    assert run(3, 1) == [str(tmp_path / "ckpt" / "attempt-2"), "44"]
    run(3, 0, "50")  # in attempt 3 only rank 0 records (it saves the whole model): its steps count
    assert run(4, 1) == [str(tmp_path / "ckpt" / "attempt-3"), "50"]


def test_stop_reason_says_why(tmp_path: Path) -> None:
    code = "from corral import job; print(job.stop_reason(), job.is_torn_down(), job.checkpoint_requested())"
    (tmp_path / "control").mkdir()

    def run() -> str:
        return subprocess.run(
            [sys.executable, "-c", code], env=env(tmp_path, 1), capture_output=True, text=True, check=True
        ).stdout.strip()

    assert run() == "None False False"
    (tmp_path / "control" / "checkpoint-requested").write_text("preempt\n")
    assert run() == "preempt False True"
    (tmp_path / "control" / "checkpoint-requested").write_text("peer_failed\n")
    assert run() == "peer_failed True True"
