"""Helpers for job code run by Corral: the checkpoint contract (DESIGN.md 4.4) from inside a worker.

```python
from corral import job

start = (job.resume_step() or 0) + 1            # resume from the newest checkpoint of an earlier attempt
for step in range(start, steps + 1):
    train_one_step()
    if step % 100 == 0 or job.checkpoint_requested():
        save(job.checkpoint_dir() / "model.pt")  # this attempt's own folder
        job.record_checkpoint(step)               # complete: the scheduler now counts lost work from here
        if job.checkpoint_requested():
            raise SystemExit(0)                   # stopped on request: does not count as a failure
```

Importing this module installs a handler for the job's checkpoint signal (`CORRAL_CHECKPOINT_SIGNAL`,
SIGTERM by default) unless the program already has one: the signal then sets a flag instead of
ending the process, and `checkpoint_requested()` reads it. The agent also writes a request file
(`$CORRAL_CONTROL_DIR/checkpoint-requested`) before it signals, which reaches processes that a
launcher such as torchrun sits in front of. After the grace period the agent kills the attempt.

Outside Corral (no `CORRAL_CHECKPOINT_DIR`), the folder is `./checkpoints` and nothing is requested.
This module imports only the standard library, so it costs job code nothing to import.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

RECORD = "corral-checkpoint.json"
REQUEST = "checkpoint-requested"
_requested = threading.Event()
_ATTEMPT = re.compile(r"attempt-(\d+)$")


def _root() -> Path:
    return Path(os.environ.get("CORRAL_CHECKPOINT_DIR") or "checkpoints")


def attempt() -> int:
    """This attempt's number (counts every attempt of the job from 1)."""
    return int(os.environ.get("CORRAL_ATTEMPT") or 1)


def checkpoint_dir() -> Path:
    """This attempt's own checkpoint folder, `$CORRAL_CHECKPOINT_DIR/attempt-<n>/` (created)."""
    path = _root() / f"attempt-{attempt()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkpoint_requested() -> bool:
    """True once Corral asked this attempt to checkpoint and stop (preemption, cancel, time limit,
    drain): save, `record_checkpoint`, and exit within the grace period."""
    if _requested.is_set():
        return True
    control = os.environ.get("CORRAL_CONTROL_DIR")
    if control and os.path.exists(os.path.join(control, REQUEST)):
        _requested.set()
    return _requested.is_set()


def record_checkpoint(step: int, **extra: Any) -> None:
    """Say that a complete checkpoint of `step` is now in `checkpoint_dir()`. Call it after the files
    are written (and flushed): the next attempt resumes from the highest recorded step, and the
    scheduler measures the work a preemption would lose from the time of this call."""
    if int(step) != step or step < 0:
        raise ValueError(f"record_checkpoint: step must be a whole number >= 0, not {step!r}")
    folder = checkpoint_dir()
    body = {"step": int(step), "attempt": attempt(), "rank": _rank(), "time": time.time(), **extra}
    tmp = folder / f".{RECORD}.{os.getpid()}"
    with open(tmp, "w") as out:
        json.dump(body, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, folder / RECORD)


def _rank() -> int:
    return int(os.environ.get("RANK") or 0)


def _record_of(folder: Path) -> dict[str, Any] | None:
    try:
        body = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and isinstance(body.get("step"), int) else None


def _newest_earlier() -> tuple[Path, int] | None:
    best: tuple[int, int, Path] | None = None
    root, mine = _root(), attempt()
    with contextlib.suppress(OSError):
        for child in root.iterdir():
            match = _ATTEMPT.match(child.name)
            if match is None or int(match.group(1)) >= mine:
                continue
            record = _record_of(child)
            if record is None:
                continue
            key = (record["step"], int(match.group(1)), child)
            if best is None or key[:2] > best[:2]:
                best = key
    return (best[2], best[0]) if best else None


def resume_dir() -> Path | None:
    """The folder of the newest complete checkpoint of an earlier attempt (highest recorded step,
    then latest attempt), or None when there is none: start from scratch."""
    found = _newest_earlier()
    return found[0] if found else None


def resume_step() -> int | None:
    """The step recorded with `resume_dir()`'s checkpoint, or None."""
    found = _newest_earlier()
    return found[1] if found else None


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _requested.set()


def _install() -> None:
    name = (os.environ.get("CORRAL_CHECKPOINT_SIGNAL") or "SIGTERM").upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    number = getattr(signal, name, None)
    if number is None or threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(number) in (signal.SIG_DFL, None):
            signal.signal(number, _on_signal)


_install()
