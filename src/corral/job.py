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

A gang's checkpoint of step N is complete when every rank of the attempt (0 .. WORLD_SIZE-1) has
recorded N, or when one rank recorded it with `whole=True` (a model replicated on every rank,
saved by rank 0 after a barrier); every rank resumes from the newest step complete in an earlier
attempt, so ranks that recorded different newest steps still agree. `stop_reason()` says why the
attempt is being stopped (preempt, cancel, time_limit, drain... or peer_failed when the gang is
torn down because another rank ended).

Outside Corral (no `CORRAL_CHECKPOINT_DIR`), the folder is `./checkpoints` and nothing is requested.
This module imports only the standard library, so it costs job code nothing to import.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

RECORD = "corral-checkpoint.json"  # the newest complete step of the attempt (the agent reports it)
RANKS = "corral-ranks"  # one file per rank: the steps it recorded
REQUEST = "checkpoint-requested"
KEPT_STEPS = 64  # steps remembered per rank (completeness needs only the recent ones)
# why the agent stops an attempt (the first line of the request file)
TEARDOWN = frozenset({"peer_failed", "lost", "ended"})  # the gang is over: a checkpoint is of no use
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


def stop_reason() -> str | None:
    """Why Corral is stopping this attempt, once it has asked (None before): `preempt`, `cancel`,
    `requeue`, `time_limit`, `drain`, `gpu` (a GPU of the gang went bad): checkpoint and exit; or
    `peer_failed`, `lost`, `ended`: the gang is being torn down, a checkpoint would be incomplete.
    The agent writes it to `$CORRAL_CONTROL_DIR/checkpoint-requested` before it signals."""
    control = os.environ.get("CORRAL_CONTROL_DIR")
    if control:
        with contextlib.suppress(OSError), open(os.path.join(control, REQUEST)) as request:
            _requested.set()
            return request.readline().strip()
    return "" if _requested.is_set() else None


def is_torn_down() -> bool:
    """True when the stop is a teardown of the gang (another rank ended, the node was lost)."""
    return stop_reason() in TEARDOWN


def step_dir(step: int) -> Path:
    """`checkpoint_dir()/step-<step>/` (created): where a sharded checkpoint's files of one step go,
    so that an older complete step stays readable while a newer one is still incomplete."""
    path = checkpoint_dir() / f"step-{int(step)}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_checkpoint(step: int, *, whole: bool = False, **extra: Any) -> None:
    """Say that this rank's part of the checkpoint of `step` is in `checkpoint_dir()`. Call it after
    the files are written (and flushed). The step is complete once every rank of the attempt has
    recorded it, or at once with `whole=True` (this rank wrote all of it, e.g. rank 0 of a
    replicated model after a barrier). The next attempt resumes from the newest complete step, and
    the scheduler measures the work a preemption would lose from when it became complete."""
    if int(step) != step or step < 0:
        raise ValueError(f"record_checkpoint: step must be a whole number >= 0, not {step!r}")
    folder = checkpoint_dir()
    ranks = folder / RANKS
    ranks.mkdir(exist_ok=True)
    mine = _read_json(ranks / f"rank-{_rank()}.json") or {}
    steps = [s for s in mine.get("steps", []) if isinstance(s, int) and s != int(step)] + [int(step)]
    wholes = [s for s in mine.get("whole", []) if isinstance(s, int)] + ([int(step)] if whole else [])
    body = {"rank": _rank(), "world_size": _world_size(), "steps": steps[-KEPT_STEPS:], "whole": wholes[-8:]}
    _write_json(ranks / f"rank-{_rank()}.json", body)
    with _locked(folder):
        complete = _complete_step(folder)
        recorded = _record_of(folder)
        # the record follows what the ranks' files say now: it may go down, when a rank's first
        # record shows that a step rank 0 recorded alone is not the gang's (rank 0 ran ahead)
        if complete is not None and (recorded is None or complete != recorded["step"]):
            record = {"step": complete, "attempt": attempt(), "rank": _rank(), "time": time.time(), **extra}
            _write_json(folder / RECORD, record)


@contextlib.contextmanager
def _locked(folder: Path) -> Any:
    """Ranks of one node finishing a step together do not overwrite a newer complete step."""
    with open(folder / f".{RECORD}.lock", "a") as lock:
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write_json(path: Path, body: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "w") as out:
        json.dump(body, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _complete_step(folder: Path) -> int | None:
    """The newest step of an attempt's folder that every rank recorded (or one recorded whole);
    when rank 0 alone recorded anything, its steps (the contract's older rank-0-saves pattern); a
    folder without rank files (an older helper) has its record's step."""
    ranks = folder / RANKS
    if not ranks.is_dir():
        record = _record_of(folder)
        return record["step"] if record else None
    found = [b for p in ranks.glob("rank-*.json") if (b := _read_json(p)) is not None]
    whole = {s for b in found for s in b.get("whole", []) if isinstance(s, int)}
    sizes = {b.get("world_size") for b in found}
    everyone: set[int] = set()
    if len(found) == 1 and found[0].get("rank") == 0:
        everyone = {s for s in found[0].get("steps", []) if isinstance(s, int)}
    elif len(sizes) == 1 and len(found) == next(iter(sizes)):
        everyone = set.intersection(*({s for s in b.get("steps", []) if isinstance(s, int)} for b in found))
    steps = everyone | whole
    return max(steps) if steps else None


def _rank() -> int:
    return int(os.environ.get("RANK") or 0)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE") or 1)


def _record_of(folder: Path) -> dict[str, Any] | None:
    try:
        body = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and isinstance(body.get("step"), int) else None


def _newest_earlier() -> tuple[Path, int] | None:
    """The earlier attempt's folder and step of the newest complete checkpoint (then latest attempt)."""
    best: tuple[int, int, Path] | None = None
    root, mine = _root(), attempt()
    with contextlib.suppress(OSError):
        for child in root.iterdir():
            match = _ATTEMPT.match(child.name)
            if match is None or int(match.group(1)) >= mine:
                continue
            step = _complete_step(child)
            if step is None:
                continue
            key = (step, int(match.group(1)), child)
            if best is None or key[:2] > best[:2]:
                best = key
    return (best[2], best[0]) if best else None


def resume_dir() -> Path | None:
    """The folder of the newest complete checkpoint of an earlier attempt (highest complete step,
    then latest attempt), or None when there is none: start from scratch. Every rank of a gang
    gets the same folder and step."""
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
