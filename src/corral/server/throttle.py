"""Failed authentications, throttled per client address (docs/control-plane.md, "Security").

A token bucket per address counts failures only: each 401 (no token, an unknown or revoked
one, a login code that does not work) takes one from the address's bucket, which refills at
`RATE` per second up to `BURST`. While the bucket is empty a failure is answered 429 with
`Retry-After` instead of 401. A request with a valid token is always authenticated first and
never refused by the throttle, so a misbehaving client on the same address (or a guesser)
cannot lock a valid token out.
"""

from __future__ import annotations

import math
import threading

BURST = 20  # failures an address may make at once
RATE = 1.0  # failures per second it regains
MAX_ADDRESSES = 10_000  # buckets kept; full ones are dropped first when over


class FailedAuthThrottle:
    def __init__(self, burst: int = BURST, rate: float = RATE) -> None:
        self.burst = burst
        self.rate = rate
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)
        self._lock = threading.Lock()

    def fail(self, address: str, now: float) -> float:
        """Count a failure from `address`; returns 0 when it may be answered as usual, else the
        seconds until the address may fail again (answer 429 with Retry-After)."""
        if self.burst <= 0:  # no limit
            return 0.0
        with self._lock:
            tokens, at = self._buckets.get(address, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[address] = (tokens - 1.0, now)
                self._trim(now)
                return 0.0
            self._buckets[address] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def _trim(self, now: float) -> None:
        if len(self._buckets) <= MAX_ADDRESSES:
            return
        for address, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self.rate >= self.burst:
                del self._buckets[address]
        while len(self._buckets) > MAX_ADDRESSES:
            del self._buckets[next(iter(self._buckets))]


def retry_after(seconds: float) -> str:
    """The Retry-After header's value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
