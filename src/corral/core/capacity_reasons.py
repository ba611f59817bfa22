"""What a cycle tells a job that capacity keeps out (`reasons.capacity`), with the cycle's memory
of what those sentences read: the reservations on the node classes a gang may use, remembered
per classes while the cycle's reservations stay as they are, and the free GPUs they hold,
remembered per classes while neither the reservations nor the state apart from reserved GPUs
change (`ClusterState.base_id`: a tried backfill gives it back; outside one, the reserved GPUs
are the reservations'). The sentences themselves are remembered by `Sentences`, within a
cycle and across cycles.

Where no one reads any reason's words (`ClusterState.words_read` and `runs_read` false: the
simulator without `on_cycle`), a capacity reason is not written (`UNREAD_WORDS`): it carries
what decisions read, its code and `at` (the first reservation's start when it is
`Why.BEHIND_RESERVATION`), found from the free GPUs its reservations hold (`held_free`, which
the code reads); its words are `reasons.RUNS` alone for `BEHIND_RESERVATION`
(a walk's `PerLimit` finds the placeholder once, as in the written sentence) and empty otherwise.
Written sentences are used where a node takes no new work or the reservation's job names the
placeholder (then the written sentence does not hold it exactly once).
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core import reasons as why_text
from corral.core.decisions import Reason, Why
from corral.core.jobs import PendingJob
from corral.core.placement import Miss, Request
from corral.core.reserve import Reservation
from corral.core.state import ClusterState
from corral.core.topology import CLUSTER

Held = list[tuple[str, float, tuple[int, ...]]]  # (job, start, nodes) of reservations, earliest first
REMEMBER_SENTENCES = True  # False: every capacity sentence built anew (tests compare: `Sentences`)
LASTING_SENTENCES = True  # False: none remembered across cycles (tests compare: `Sentences`)
LASTING_MAX = 4096  # the sentences remembered across cycles are forgotten at this many
# a sentence asked with `reasons.RUNS` (a walk's family verdict) is the remembered template itself,
# one object while it is remembered (False: built anew each time; tests compare:
# `test_verdict_memory`)
SAME_TEMPLATE = True
# no capacity sentence written where no one reads words (`ClusterState.words_read`; False: always
# written; tests compare: `test_unread_words`)
UNREAD_WORDS = True
_UNWRITTEN_CAPACITY = Reason(Why.CAPACITY, "")
_UNWRITTEN_TOPOLOGY = Reason(Why.TOPOLOGY, "")


class CapacityReasons:
    """The capacity sentences of one cycle at `now`; `reservations` is the cycle's own list (read,
    never changed here), `generation` (passed with each question) names its contents."""

    __slots__ = (
        "generation",
        "held_free_memo",
        "mute",
        "now",
        "reservations",
        "reserved_memo",
        "sentences",
        "state",
    )

    def __init__(self, state: ClusterState, now: float, reservations: list[Reservation]) -> None:
        self.state = state
        self.now = now
        self.reservations = reservations
        self.generation = 0
        self.sentences = Sentences(state, now)
        # per node classes: (generation, reservations on them) and ((generation, base id), GPUs)
        self.reserved_memo: dict[tuple[int, ...], tuple[int, Held]] = {}
        self.held_free_memo: dict[tuple[int, ...], tuple[tuple[int, int], int]] = {}
        # no one reads the words of this cycle's reasons (see the module)
        self.mute = UNREAD_WORDS and not state.words_read and not state.runs_read

    def reason(
        self, job: PendingJob, req: Request, placed: Miss, generation: int, runs: str | None = None
    ) -> Reason:
        """Why the job does not fit now (`reasons.capacity`; `runs`: see there)."""
        self.generation = generation
        if self.mute and not self.state.unschedulable:
            found = self.unwritten(req, placed)
            if found is not None:
                return found
        limit = job.spec.time_limit
        ends_by = None if limit is None else self.now + limit
        held = self.reserved_for(req)
        if not held:
            return self.sentences.capacity(req, placed, held, generation, ends_by)
        return self.sentences.capacity(req, placed, held, generation, ends_by, self.held_free, runs)

    def unwritten(self, req: Request, placed: Miss) -> Reason | None:
        """`reason`'s code and `at`, without its words (see the module; None: written)."""
        if why_text.scope_of(self.state, placed) != CLUSTER:
            return _UNWRITTEN_TOPOLOGY
        held = self.reserved_for(req)
        reserved = self.held_free(req, held) if held else 0
        if not reserved or placed.best_gpus + reserved < req.gpus:
            return _UNWRITTEN_CAPACITY
        job, start, _ = held[0]
        if why_text.RUNS in job:
            return None
        return Reason(Why.BEHIND_RESERVATION, why_text.RUNS, start)

    def per_limit(self, why: Reason, limit: float | None) -> why_text.PerLimit | None:
        """`reasons.PerLimit.of(why, now, limit)`; where the words are not written, one with no
        words around the placeholder whose reason is `why` itself."""
        if self.mute and why.message.startswith(why_text.RUNS):  # (an unwritten sentence)
            if why.message.count(why_text.RUNS) != 1:
                return None
            return why_text.PerLimit("", "", self.now, why)
        return why_text.PerLimit.of(why, self.now, limit)

    def reserved_for(self, req: Request) -> Held:
        """(job, start, nodes) of the cycle's reservations on nodes the gang may use, earliest
        first (remembered per classes: reservations are only added during a cycle)."""
        if not self.reservations:
            return []
        known = self.reserved_memo.get(req.classes)
        if known is not None and known[0] == self.generation:
            return known[1]
        allowed, node_class = set(req.classes), self.state.node_class
        held = [
            (r.job, r.start, tuple(n for n, _ in r.capacity if node_class[n] in allowed))
            for r in self.reservations
        ]
        found = sorted(h for h in held if h[2])
        self.reserved_memo[req.classes] = (self.generation, found)
        return found

    def held_free(self, req: Request, held: why_text.Reservations) -> int:
        """`reasons.held_free_gpus`, remembered per classes (see the module)."""
        key = (self.generation, self.state.base_id)
        known = self.held_free_memo.get(req.classes)
        if known is not None and known[0] == key:
            return known[1]
        found = why_text.held_free_gpus(self.state, req, held)
        self.held_free_memo[req.classes] = (key, found)
        return found


class Sentences:
    """The capacity sentences of one cycle at `now` (`reasons.capacity`), remembered per (request, miss,
    reservations, `ClusterState.base_id`): the jobs of a shape blocked alike are told one
    sentence, built once, with `reasons.RUNS` where a job's own end goes (`Why.BEHIND_RESERVATION`),
    filled in for each job. The base id names everything a sentence reads but the reserved GPUs
    (work undone through the plan gives its id back, so a tried backfill leaves the memory
    valid); inside a cycle, outside a backfill attempt or a search, those are the cycle's
    reservations, which the caller's `generation` names. A sentence not in this cycle's memory is
    looked up by the values it reads (`reasons.lasting_key`: free and held GPUs, the first reservation,
    the most on one node, the nodes that take no new work) in the state's caches, kept across
    cycles while static capacity holds (`LASTING_SENTENCES`): on a long backlog the state changes
    every cycle, the sentences rarely. Answers exactly what `reasons.capacity` does."""

    __slots__ = ("memo", "now", "state")

    def __init__(self, state: ClusterState, now: float) -> None:
        self.state = state
        self.now = now
        # (request's id, miss span, miss best GPUs, reservations' generation, base id) ->
        # (request, sentence, its parts around `reasons.RUNS` if it names the job's end)
        self.memo: dict[tuple[int, int, int, int, int], tuple[Request, Reason, tuple[str, str] | None]] = {}

    def capacity(
        self,
        req: Request,
        miss: Miss,
        reservations: Sequence[tuple[str, float, tuple[int, ...]]],
        generation: int,
        ends_by: float | None,
        held_free: why_text.HeldFree | None = None,
        runs: str | None = None,
    ) -> Reason:
        """`capacity(state, req, miss, reservations, ends_by, now, held, runs)`, where `held()` is
        `held_free(req, reservations)` and `reservations` is a function of (the request's
        classes, `generation`)."""
        state = self.state
        if not REMEMBER_SENTENCES:
            held = None if held_free is None else lambda: held_free(req, reservations)
            return why_text.capacity(state, req, miss, reservations, ends_by, self.now, held, runs)
        # the request by identity (hashing it costs more than building many sentences): the
        # memory holds it, so no other object takes its id while the entry lives
        key = (id(req), miss.span, miss.best_gpus, generation, state.base_id)
        found = self.memo.get(key)
        if found is None:
            held = None if held_free is None else lambda: held_free(req, reservations)
            lasting = state.caches.sentences
            values = (
                why_text.lasting_key(state, req, miss, reservations, self.now, held)
                if LASTING_SENTENCES
                else None
            )
            if values is not None:
                found = lasting.get(values)
                if found is not None and found[0] is not req:
                    found = None  # (another request of the same id: not possible while held)
            if found is None:
                template = why_text.capacity(
                    state, req, miss, reservations, None, self.now, held, why_text.RUNS
                )
                parts: tuple[str, str] | None = None
                if template.code is Why.BEHIND_RESERVATION:
                    split = template.message.split(why_text.RUNS)
                    if len(split) != 2:  # (a name holding the placeholder: no memory)
                        return why_text.capacity(
                            state, req, miss, reservations, ends_by, self.now, held, runs
                        )
                    parts = (split[0], split[1])
                found = (req, template, parts)
                if values is not None:
                    if len(lasting) >= LASTING_MAX:
                        lasting.clear()
                    lasting[values] = found
            self.memo[key] = found
        _, template, parts = found
        if parts is None or (SAME_TEMPLATE and runs is not None and runs == why_text.RUNS):
            return template  # (with `RUNS` where the job's end goes: the template itself)
        if runs is None:
            runs = why_text.runs_until(ends_by, self.now)
        return Reason(template.code, parts[0] + runs + parts[1], template.at)
