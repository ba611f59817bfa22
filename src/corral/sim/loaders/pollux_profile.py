"""Pollux application profiles (step times, convergence) and the run time of a rigid job derived from them."""

from __future__ import annotations

import csv
import math
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from corral.core.errors import TraceError
from corral.sim.trace_cells import column_indices, parse_count, parse_float

Sample = tuple[float, float, float]  # local batch size, step time (s), of which synchronisation (s)
Epoch = tuple[float, float, float]  # progress at the end of the epoch, gradient square, gradient variance

# The one setting of the Pollux simulator's application table (simulator/applications.py) that the
# profile files do not carry: YOLOv3's largest local batch size is 8 although 11 and 16 were profiled.
# Every other application uses the profile's own bounds and epoch count, as that table does.
MAX_LOCAL_BSZ = {"yolov3": 8}


@dataclass(frozen=True, slots=True)
class AppProfile:
    """One application's measured profile (`pollux/profiles/<app>/`)."""

    name: str
    placements: dict[tuple[int, ...], list[Sample]]  # canonical placement -> samples sorted by batch size
    scalability: dict[tuple[int, int], list[Sample]]  # (nodes, replicas) -> samples sorted by batch size
    validation: dict[int, list[Epoch]]  # total batch size -> one entry per epoch
    min_local_bsz: float
    max_local_bsz: float

    @property
    def init_batch_size(self) -> int:
        return min(self.validation)

    @property
    def max_batch_size(self) -> int:
        return max(self.validation)

    @property
    def max_epochs(self) -> int:
        return min(len(rows) for rows in self.validation.values())


def load_profile(directory: Path) -> AppProfile:
    """Read `placements.csv`, `scalability.csv` and every `validation-<batch size>.csv` of one application."""
    placements: dict[tuple[int, ...], list[Sample]] = {}
    for values, sample in _samples(directory / "placements.csv", ("placement",)):
        placements.setdefault(canonical(tuple(int(d) for d in str(values[0]))), []).append(sample)
    scalability: dict[tuple[int, int], list[Sample]] = {}
    for values, sample in _samples(directory / "scalability.csv", ("num_nodes", "num_replicas")):
        scalability.setdefault((values[0], values[1]), []).append(sample)
    validation = {
        int(path.stem.rsplit("-", 1)[1]): _epochs(path) for path in sorted(directory.glob("validation-*.csv"))
    }
    if not placements or not validation:
        raise TraceError(
            f"{directory}: no placements.csv rows or no validation-*.csv (fix: point at a profile folder)"
        )
    for table in (placements, scalability):
        for samples in table.values():
            samples.sort()
    every = [s[0] for samples in placements.values() for s in samples]
    name = directory.name
    return AppProfile(
        name=name,
        placements=placements,
        scalability=scalability,
        validation=validation,
        min_local_bsz=min(every),
        max_local_bsz=MAX_LOCAL_BSZ.get(name, max(every)),
    )


def canonical(placement: tuple[int, ...]) -> tuple[int, ...]:
    """Replicas per node without empty nodes, as the smallest rotation (the profiles' key)."""
    nodes = tuple(n for n in placement if n)
    return min(nodes[i:] + nodes[:i] for i in range(len(nodes)))


def packed(num_replicas: int, node_gpus: int) -> tuple[int, ...]:
    """Replicas packed on whole nodes first: 10 on 4-GPU nodes is (4, 4, 2)."""
    full, rest = divmod(num_replicas, node_gpus)
    return (node_gpus,) * full + ((rest,) if rest else ())


def _samples(path: Path, keys: tuple[str, ...]) -> list[tuple[list[int], Sample]]:
    """(key values, sample) per row of a step-time file, columns found by name."""
    rows: list[tuple[list[int], Sample]] = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        index = column_indices(next(reader, None), (*keys, "local_bsz", "step_time", "sync_time"), path)
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            values = [parse_count(row[index[k]], path, line, k) for k in keys]
            numbers = (
                parse_float(row[index[c]], path, line, c) for c in ("local_bsz", "step_time", "sync_time")
            )
            rows.append((values, (next(numbers), next(numbers), next(numbers))))
    return rows


def _epochs(path: Path) -> list[Epoch]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        index = column_indices(next(reader, None), ("progress", "grad_sqr", "grad_var"), path)
        return [
            (
                parse_float(row[index["progress"]], path, reader.line_num, "progress"),
                parse_float(row[index["grad_sqr"]], path, reader.line_num, "grad_sqr"),
                parse_float(row[index["grad_var"]], path, reader.line_num, "grad_var"),
            )
            for row in reader
            if row
        ]


def step_times(profile: AppProfile, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
    """(step time, sync time) in seconds at a placement and a local batch size, interpolated linearly.

    A placement in `placements.csv` interpolates between its batch sizes. Any other (more than four
    nodes) uses the `scalability.csv` rows of the same node and replica counts; Pollux interpolates
    those in three dimensions (scipy's LinearNDInterpolator), which this does not reproduce.
    """
    key = canonical(placement)
    samples = profile.placements.get(key)
    if samples is None:
        samples = profile.scalability.get((min(len(key), 16), sum(key)))
    if samples is None:
        raise TraceError(
            f"{profile.name}: no step time measured for placement {key}"
            " (fix: use a replica count the profile covers)"
        )
    return _interpolate(samples, local_bsz, profile.name, key)


def _interpolate(samples: list[Sample], x: float, name: str, key: tuple[int, ...]) -> tuple[float, float]:
    xs = [s[0] for s in samples]
    if not xs[0] <= x <= xs[-1]:
        raise TraceError(
            f"{name}: local batch size {x} is outside the profiled {xs[0]}..{xs[-1]} for placement {key}"
            " (fix: choose a batch size and replica count inside the profile)"
        )
    i = bisect_left(xs, x)
    if xs[i] == x:
        return samples[i][1], samples[i][2]
    (x0, step0, sync0), (x1, step1, sync1) = samples[i - 1], samples[i]
    w = (x - x0) / (x1 - x0)
    return step0 + w * (step1 - step0), sync0 + w * (sync1 - sync0)


def _grad_stats(profile: AppProfile, batch_size: float, epoch: int) -> tuple[float, float]:
    """(gradient square, variance) at an epoch, linear between the two nearest validated batch sizes."""
    sizes = sorted(profile.validation)
    if not sizes[0] <= batch_size <= sizes[-1]:
        raise TraceError(
            f"{profile.name}: batch size {batch_size} is outside the validated {sizes[0]}..{sizes[-1]}"
            " (fix: choose a batch size inside that range)"
        )
    lower = max(b for b in sizes if b <= batch_size)
    upper = min(b for b in sizes if b >= batch_size)
    _, sqr0, var0 = profile.validation[lower][epoch]
    if lower == upper:
        return sqr0, var0
    _, sqr1, var1 = profile.validation[upper][epoch]
    w = (batch_size - lower) / (upper - lower)
    return sqr0 + w * (sqr1 - sqr0), var0 + w * (var1 - var0)


def _progress(profile: AppProfile, epoch: int) -> float:
    """Progress (samples, scaled by statistical efficiency) needed to finish `epoch` epochs."""
    if epoch == 0:
        return 0.0
    return min(rows[epoch - 1][0] for rows in profile.validation.values())


def local_batch(profile: AppProfile, num_replicas: int, batch_size: int) -> tuple[int, int]:
    """(per-step batch per replica, gradient-accumulation steps) as the Pollux simulator sets them."""
    local = math.ceil(batch_size / num_replicas - 1e-8)
    accum = math.ceil(local / profile.max_local_bsz - 1e-8) - 1
    if num_replicas == 1 and batch_size > profile.init_batch_size:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    return min(atomic, int(profile.max_batch_size / (num_replicas * (accum + 1)))), accum


def rigid_duration(profile: AppProfile, num_replicas: int, batch_size: int, *, node_gpus: int = 4) -> float:
    """Seconds a job needs on `num_replicas` GPUs packed on `node_gpus`-GPU nodes, at a fixed batch size.

    The sum over the application's epochs of (progress of the epoch) / goodput, where goodput =
    statistical gain / time per step, as the Pollux simulator's `Job.step` advances a job whose
    replicas and batch size never change. Its 30 s restart delay and 60 s rounds are not included.
    """
    if num_replicas < 1:
        raise TraceError(f"{profile.name}: {num_replicas} replicas (fix: a job needs at least one)")
    atomic, accum = local_batch(profile, num_replicas, batch_size)
    total = num_replicas * atomic * (accum + 1)
    step, sync = step_times(profile, packed(num_replicas, node_gpus), atomic)
    step_time = step + (step - sync) * accum
    scale = total / profile.init_batch_size
    seconds = 0.0
    for epoch in range(profile.max_epochs):
        sqr, var = _grad_stats(profile, total, epoch)
        gain = (var + sqr) / (var / scale + sqr)
        seconds += (_progress(profile, epoch + 1) - _progress(profile, epoch)) * step_time / gain
    return seconds
