"""The tightest span each gang shape could have on the empty cluster (the simulator's "ideal")."""

from __future__ import annotations

from corral.core.placement import Request
from corral.core.request import static_capacity
from corral.core.state import ClusterState


class IdealSpans:
    """Caches, per placement request, the tightest span that holds the gang when nothing runs."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        # by identity (requests are cached per shape, and hashing one field by field costs more
        # than the rest of a lookup); each entry keeps its request, so that its id is never reused
        self._by_id: dict[int, tuple[Request, int]] = {}
        self._cache: dict[Request, int] = {}

    def of(self, req: Request) -> int:
        found = self._by_id.get(id(req))
        if found is not None and found[0] is req:
            return found[1]
        span = self._cache.get(req)
        if span is None:
            last = len(self.state.topology.span_names) - 1
            span = next(
                (s for s in range(last + 1) if static_capacity(self.state, req, s) >= req.replicas), last
            )
            self._cache[req] = span
        if len(self._by_id) < 65536:
            self._by_id[id(req)] = (req, span)
        return span
