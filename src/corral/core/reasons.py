"""The sentences of reasons: small pure functions from what a cycle saw to what people read.

Times in a sentence are absolute (`clock`): Unix times as UTC clock times (with the date when
more than a day away), a simulation's seconds from the trace's start as `t=1840s`. The `Reason`
also carries the time (`Reason.at`), so that the CLI and the dashboard can add how far away it
is ("in 3m"). Nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Final, final

from corral.core.decisions import Reason, Why
from corral.core.estimates import Estimate
from corral.core.model import NodeState
from corral.core.placement import Miss, Request
from corral.core.state import ClusterState
from corral.core.topology import CLUSTER

UNIX_EPOCH_FLOOR = 1e9  # a time at or above this is Unix time (after 2001); below, a simulation's seconds
_NAMES_SHOWN = 3


def clock(t: float, now: float | None = None) -> str:
    """An absolute time as people read it: `10:45:00 UTC` (Unix time) or `t=1840s` (simulated)."""
    if t < UNIX_EPOCH_FLOOR:
        return f"t={t:.0f}s"
    when = datetime.fromtimestamp(t, UTC)
    if now is not None and abs(t - now) >= 86400:
        return when.strftime("%Y-%m-%d %H:%M:%S UTC")
    return when.strftime("%H:%M:%S UTC")


def plural(n: int, word: str) -> str:
    """`1 replica`, `2 replicas`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def gang(replicas: int, gpus_per_replica: int) -> str:
    """`8 GPUs` for one replica, `2 x 8 GPUs` for a gang."""
    gpus = plural(gpus_per_replica, "GPU")
    return f"{replicas} x {gpus}" if replicas > 1 else gpus


def held() -> Reason:
    return Reason(Why.HELD, "held by a user or an admin; `corral release` lets it run")


def backoff(not_before: float, now: float) -> Reason:
    return Reason(Why.BACKOFF, f"restart backoff: may start at {clock(not_before, now)}", not_before)


def paused(by: str, since: float | None) -> Reason:
    """Why every pending job waits while an admin has paused scheduling."""
    when = f" since {clock(since)}" if since is not None else ""
    who = f" by {by}" if by else ""
    return Reason(
        Why.PAUSED, f"scheduling is paused{who}{when}; `corral admin resume` lets jobs start", since
    )


def with_reservation(reason: Reason, start: float, now: float) -> Reason:
    """The job's own reservation: it starts then at the latest (if running jobs end on time). An
    unwritten capacity sentence (`unwritten`) stays unwritten."""
    if unwritten(reason):
        return Reason(Why.RESERVED, reason.message, start)
    return Reason(Why.RESERVED, f"{reason.message}; reserved to start at {clock(start, now)}", start)


def with_estimated_reservation(reason: Reason, start: float, now: float, estimate: Estimate) -> Reason:
    """A reservation whose start rests on when jobs without a time limit are expected to end."""
    source = (
        f"estimated from {plural(estimate.drawn_on, 'finished job')} of {estimate.basis}"
        if estimate.drawn_on
        else f"estimated: {estimate.basis}"
    )
    return Reason(
        Why.RESERVED, f"{reason.message}; reserved to start at about {clock(start, now)} ({source})", start
    )


def hold_later(reason: Reason, at: float, now: float) -> Reason:
    """The GPUs it needs are held by jobs without a time limit: it gets a reservation from their
    estimated ends once it has waited long enough (`Profile.hold_after`)."""
    return Reason(
        reason.code,
        f"{reason.message}; the GPUs it needs are held by jobs without a time limit: GPUs are "
        f"reserved for it from their estimated ends at {clock(at, now)}",
        at,
    )


def with_protection(reason: Reason, until: float, now: float) -> Reason:
    """Jobs it could preempt are inside their `min_runtime` until `until` (an unwritten capacity
    sentence, `unwritten`, stays unwritten)."""
    if unwritten(reason):
        return Reason(reason.code, reason.message, until)
    return Reason(
        reason.code,
        f"{reason.message}; the jobs it may preempt are protected by min_runtime until {clock(until, now)}",
        until,
    )


def capacity(
    state: ClusterState,
    req: Request,
    miss: Miss,
    reservations: Sequence[tuple[str, float, tuple[int, ...]]],
    ends_by: float | None,
    now: float,
    held_free: Callable[[], int] | None = None,
    runs: str | None = None,
) -> Reason:
    """Why a gang does not fit now: free GPUs, what holds them (reservations of other jobs, nodes
    that take no new work), the tightest domain it must fit (naming the best one).

    `reservations`: (job, start, nodes) of this cycle's reservations on nodes the gang may use,
    earliest first; `ends_by`: when the job would end if it started now (its
    time limit; None: it has none); `held_free`: what `held_free(state, req, reservations)`
    answers (a cycle remembers it while no node changes); `runs`: the words naming when the job
    would end, instead of `runs_until(ends_by, now)` (a walk's placeholder: `PerLimit`).
    """
    need = gang(req.replicas, req.gpus_per_replica)
    scope = scope_of(state, miss)
    if scope == CLUSTER:
        free = "1 GPU is" if miss.best_gpus == 1 else f"{miss.best_gpus} GPUs are"
        text, code, at = f"needs {need}; {free} free in the cluster", Why.CAPACITY, None
        reserved = 0
        if reservations:
            reserved = held_free() if held_free is not None else held_free_gpus(state, req, reservations)
        if reserved and miss.best_gpus + reserved >= req.gpus:
            job, start, _ = reservations[0]
            are = "is" if reserved == 1 else "are"
            held_text = (
                f"{plural(reserved, 'free GPU')} {are} held"
                if not miss.best_gpus
                else f"{reserved} more {are} held"
            )
            head = f"needs {need}; " if not miss.best_gpus else f"{text}, and "
            if runs is None:
                runs = runs_until(ends_by, now)
            others = len(reservations) - 1
            whose = f"{job}'s reservation" + (f" (and {plural(others, 'other')})" if others else "")
            text = (
                f"{head}{held_text} for {whose} at {clock(start, now)}, and {runs}: "
                "starting it would delay that reservation"
            )
            code, at = Why.BEHIND_RESERVATION, start
        elif miss.best_gpus >= req.gpus:
            text += f", at most {_most_on_one_node(state, req)} on one node"
    elif scope in ("nvlink", "node"):
        where = "NVLink domain" if scope == "nvlink" else "node"
        text, code, at = f"needs {need} inside one {where} (required); none has room now", Why.TOPOLOGY, None
        most = _most_on_one_node(state, req)
        if most:
            text += f" (at most {most} free on one node)"
    else:
        best, label = _best_domain(state, req, miss.span)
        text = f"needs {need} inside one {scope} (required); the most free in one {scope} is {best}"
        text += f", in {scope} {label}" if label else ""
        code, at = Why.TOPOLOGY, None
    return Reason(code, text + _unavailable(state, req), at)


Reservations = Sequence[tuple[str, float, tuple[int, ...]]]  # (job, start, nodes), earliest first
HeldFree = Callable[[Request, Reservations], int]  # `held_free_gpus`, or a cycle's memory of it


def lasting_key(
    state: ClusterState,
    req: Request,
    miss: Miss,
    reservations: Reservations,
    now: float,
    held_free: Callable[[], int] | None,
) -> tuple[object, ...] | None:
    """Everything `capacity`'s sentence with `RUNS` for the job's end reads, as values: the same
    values give the same sentence in any cycle while static capacity holds (the state's caches,
    which hold these sentences, are replaced when it changes; the request is named by its id, the
    memory holding it). None: a sentence naming a span's best domain, not remembered."""
    scope = scope_of(state, miss)
    if scope == CLUSTER:
        unavailable = _unavailable(state, req)
        reserved = 0
        if reservations:
            reserved = held_free() if held_free is not None else held_free_gpus(state, req, reservations)
        if reserved and miss.best_gpus + reserved >= req.gpus:
            job, start, _ = reservations[0]
            when = now if start >= UNIX_EPOCH_FLOOR else None  # (`clock` reads it only then)
            return (
                id(req),
                scope,
                miss.best_gpus,
                reserved,
                job,
                start,
                len(reservations),
                when,
                unavailable,
            )
        most = _most_on_one_node(state, req) if miss.best_gpus >= req.gpus else -1
        return (id(req), scope, miss.best_gpus, most, unavailable)
    if scope in ("nvlink", "node"):
        return (id(req), scope, _most_on_one_node(state, req), _unavailable(state, req))
    return None


def runs_until(ends_by: float | None, now: float) -> str:
    """When a job that starts now would end, in a capacity sentence (`Why.BEHIND_RESERVATION`)."""
    return "it has no time limit" if ends_by is None else f"it would run until {clock(ends_by, now)}"


def held_free_gpus(
    state: ClusterState, req: Request, reservations: Sequence[tuple[str, float, tuple[int, ...]]]
) -> int:
    """Free GPUs of the gang's classes that reservations hold (a node's reserved count may include
    GPUs still in use: only its free ones count here)."""
    allowed = set(req.classes)
    nodes = {n for _, _, held in reservations for n in held if state.node_class[n] in allowed}
    reserved, free = state.reserved, state.free_count  # (`free_count[n]`: `free_mask(n)`'s GPUs)
    return sum(min(reserved[n], free[n]) for n in nodes if state.is_schedulable(n))


def _most_on_one_node(state: ClusterState, req: Request) -> int:
    """The most available GPUs on one node of the classes the gang may use."""
    per_class = state.index.buckets[0]
    most = 0
    for cls in req.classes:
        buckets = per_class.get(cls)
        if buckets is None:
            continue
        for k in range(len(buckets) - 1, most, -1):
            if buckets[k]:
                most = k
                break
    return most


def _best_domain(state: ClusterState, req: Request, span: int) -> tuple[int, str]:
    """The most available GPUs in one domain of `span` (for the gang's classes), and its name."""
    topo = state.topology
    depth = topo.depth_of_span(span)
    best, label = 0, ""
    for dom in topo.by_depth[depth]:
        free = state.index.capacity(dom, req.classes, max(1, req.gpus_per_replica))[1]
        if free > best or not label:
            best, label = free, topo.domains[dom].path[-1] if topo.domains[dom].path else ""
    return best, label


def _unavailable(state: ClusterState, req: Request) -> str:
    """The nodes of the gang's classes that take no new work (cordoned, draining, down) and the
    healthy idle GPUs they hold, when there are any."""
    if not state.unschedulable:
        return ""
    allowed = set(req.classes)
    nodes = [n for n in sorted(state.unschedulable) if state.node_class[n] in allowed]
    gpus = sum((state.healthy[n] & ~state.alloc[n]).bit_count() for n in nodes)
    if not gpus:
        return ""
    shown = ", ".join(
        f"{state.specs[n].name} ({_state_word(state.node_state[n])})" for n in nodes[:_NAMES_SHOWN]
    )
    more = f" and {len(nodes) - _NAMES_SHOWN} more" if len(nodes) > _NAMES_SHOWN else ""
    return f"; {plural(gpus, 'idle GPU')} on nodes that take no new work: {shown}{more}"


def _state_word(node_state: NodeState) -> str:
    return node_state.value


def relative(at: float, now: float) -> str:
    """How far `at` is from `now`: `in 3m`, `in 1h05m`, `12s ago`, `now`."""
    d = at - now
    s = round(abs(d))
    if s < 1:
        return "now"
    if s < 60:
        text = f"{s}s"
    elif s < 3600:
        text = f"{s // 60}m"
    elif s < 86400:
        text = f"{s // 3600}h{s % 3600 // 60:02d}m"
    else:
        text = f"{s // 86400}d{s % 86400 // 3600}h"
    return f"in {text}" if d > 0 else f"{text} ago"


def with_relative(message: str, at: float | None, now: float) -> str:
    """A reason's sentence for a reader at `now`: the time it names followed by how far it is,
    e.g. `reserved to start at 10:45:00 UTC (in 3m)` (the stored sentence never counts down)."""
    if at is None or at < UNIX_EPOCH_FLOOR:
        return message
    for text in (clock(at), clock(at, at + 86400)):  # as written near its time, or with the date
        i = message.find(text)
        if i >= 0:
            end = i + len(text)
            return f"{message[:end]} ({relative(at, now)}){message[end:]}"
    return f"{message} ({relative(at, now)})"


RUNS = "\x00"  # in a family's capacity sentence, where each job's own end goes (`PerLimit`)


def scope_of(state: ClusterState, miss: Miss) -> str:
    """The span a capacity miss names: `CLUSTER` (the cluster's free GPUs), else the tightest
    domain the gang must fit (a topology reason)."""
    names = state.topology.span_names
    return names[min(miss.span, len(names) - 1)]


def unwritten(reason: Reason) -> bool:
    """Whether `reason` is a capacity sentence not written because no one reads words
    (`capacity_reasons.UNREAD_WORDS`: empty, or the placeholder alone; a written sentence never is)."""
    message = reason.message
    return not message or message == RUNS


@final
class PerLimit:
    """A capacity sentence that names when the job would end (`Why.BEHIND_RESERVATION`): the same
    for every job of a family but for those words, filled in from each job's time limit when read
    (`reasons.runs_until`). `reason`: the sentence of the job it was built for. Immutable, compared
    by value (written out as `Reason` is, for the compiled core)."""

    __slots__ = ("head", "now", "reason", "tail")

    def __init__(self, head: str, tail: str, now: float, reason: Reason) -> None:
        self.head: Final = head
        self.tail: Final = tail
        self.now: Final = now
        self.reason: Final = reason

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PerLimit):
            return NotImplemented
        return (
            self.head == other.head
            and self.tail == other.tail
            and self.now == other.now
            and self.reason == other.reason
        )

    def __hash__(self) -> int:
        return hash((self.head, self.tail, self.now, self.reason))

    def __repr__(self) -> str:
        return f"PerLimit(head={self.head!r}, tail={self.tail!r}, now={self.now!r}, reason={self.reason!r})"

    @staticmethod
    def of(template: Reason, now: float, limit: float | None) -> PerLimit | None:
        """From a sentence with `RUNS` once where the end goes (None: not exactly once), built for
        a job with time limit `limit`."""
        parts = template.message.split(RUNS)
        if len(parts) != 2:
            return None
        head, tail = parts
        runs = runs_until(None if limit is None else now + limit, now)
        return PerLimit(head, tail, now, Reason(template.code, head + runs + tail, template.at))

    def resolve(self, limit: float | None) -> Reason:
        """The sentence of a job with this time limit."""
        runs = runs_until(None if limit is None else self.now + limit, self.now)
        return Reason(self.reason.code, self.head + runs + self.tail, self.reason.at)
