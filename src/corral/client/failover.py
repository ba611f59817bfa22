"""Sending a request to one of several server addresses (replicas of one control plane).

`--server URL1,URL2` (or `CORRAL_SERVER`, or the config file) names the replicas. Requests go
to the address in use, which stays the same while it answers; a failure moves it to the next
one, so the next request goes there. Within one call, the request is sent again to the next
address only when that cannot make something happen twice:

- the connection could not be made (refused, no route, connect timeout): nothing was sent, so
  any request moves on;
- the request went out but no answer came (a timeout, a dropped connection), or a proxy or a
  dying replica answered 502, 503 or 504: only a request that may be repeated moves on, i.e.
  GET, HEAD, OPTIONS, PUT and DELETE, a submission carrying an `Idempotency-Key` (the server
  returns the job the first copy made), and calls the caller marks repeatable (heartbeats).
  Anything else (a POST without a key) raises, and the caller decides.

With several addresses the list is tried twice (a short pause between the rounds, for a replica
that is restarting); with one address there is one try, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

from corral.client.errors import UNREACHABLE, ClientError

__all__ = ["REPEATABLE_METHODS", "RETRY_STATUSES", "Failover", "parse_servers"]

REPEATABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
RETRY_STATUSES = frozenset({502, 503, 504})  # a proxy, or a replica that cannot serve right now
ROUNDS = 2  # passes over the addresses in one call, when there are several
PAUSE = 0.5  # seconds between two passes
START_HINT = (
    "start one with `corral up` (this machine) or `corral server`, "
    "or point at yours with --server URL or CORRAL_SERVER"
)


def parse_servers(text: str) -> list[str]:
    """The addresses of `URL1,URL2,...` (spaces around commas allowed); ValueError when bad."""
    urls = [part.strip().rstrip("/") for part in text.split(",") if part.strip()]
    if not urls:
        raise ValueError(f"server {text!r} names no URL: give http://HOST:PORT (several: URL1,URL2)")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server URL {url!r} must start with http:// or https://")
    return urls


class Failover:
    """One httpx session and the addresses it may use; thread-safe."""

    def __init__(
        self,
        servers: str,
        headers: Mapping[str, str],
        timeout: float,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.urls = parse_servers(servers)
        self.timeout = timeout
        self._index = 0
        self._lock = threading.Lock()
        self._http = httpx.Client(headers=dict(headers), timeout=timeout, transport=transport)

    @property
    def url(self) -> str:
        """The address in use now."""
        return self.urls[self._index]

    def close(self) -> None:
        self._http.close()

    def _moved_from(self, index: int) -> None:
        with self._lock:
            if self._index == index:  # another thread may have moved on already
                self._index = (index + 1) % len(self.urls)

    def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: object = None,
        headers: Mapping[str, str] | None = None,
        wait: float = 0.0,
        repeatable: bool | None = None,
    ) -> httpx.Response:
        """The answer of the first address that gives one (a refusal included: the caller reads
        it); ClientError(UNREACHABLE) when none does. `repeatable` None: decided by the method
        and an `Idempotency-Key` header."""
        if repeatable is None:
            repeatable = method in REPEATABLE_METHODS or "Idempotency-Key" in (headers or {})
        several = len(self.urls) > 1
        tries = len(self.urls) * ROUNDS if several else 1
        failures: dict[str, str] = {}
        for n in range(tries):
            if n and n % len(self.urls) == 0:
                time.sleep(PAUSE)
            index = self._index
            url = self.urls[index]
            try:
                response = self._http.request(
                    method, url + path, params=params, json=body, headers=headers, timeout=self.timeout + wait
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # not sent: any request moves on
                failures[url] = _why(exc)
                self._moved_from(index)
                continue
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                failures[url] = _why(exc, self.timeout + wait)
                self._moved_from(index)
                if repeatable:
                    continue
                raise _unsure(url, method, path, failures[url]) from None
            except httpx.HTTPError as exc:
                raise ClientError(
                    UNREACHABLE, f"talking to the Corral server at {url} failed: {exc}", "try again"
                ) from None
            if several and response.status_code in RETRY_STATUSES:
                self._moved_from(index)
                if repeatable and n + 1 < tries:
                    failures[url] = f"HTTP {response.status_code}"
                    continue
            return response
        raise _none_answered(failures, self.timeout + wait)


def _why(exc: httpx.HTTPError, timeout: float = 0.0) -> str:
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return f"no answer within {timeout:g}s"
    text = str(exc)
    if "refused" in text.lower():
        return "connection refused"
    return text or type(exc).__name__


def _unsure(url: str, method: str, path: str, why: str) -> ClientError:
    """A request that went out without an answer, and that is not sent again on its own."""
    if why.startswith("no answer within"):
        return ClientError(
            UNREACHABLE,
            f"the Corral server at {url} did not answer within {why.rsplit(' ', 1)[-1]}",
            "check that it is running and not overloaded, then try again "
            f"(the {method} {path} may or may not have been done: look before repeating it)",
        )
    return ClientError(
        UNREACHABLE,
        f"the connection to the Corral server at {url} dropped before its answer ({why})",
        f"look whether the {method} {path} was done before repeating it",
    )


def _none_answered(failures: dict[str, str], timeout: float) -> ClientError:
    if len(failures) == 1:
        url, why = next(iter(failures.items()))
        if why.startswith("no answer within"):
            return ClientError(
                UNREACHABLE,
                f"the Corral server at {url} did not answer within {timeout:g}s",
                "check that it is running and not overloaded, then try again",
            )
        return ClientError(UNREACHABLE, f"the Corral server at {url} is not reachable ({why})", START_HINT)
    said = "; ".join(f"{url}: {why}" for url, why in failures.items())
    return ClientError(UNREACHABLE, f"none of the Corral servers answered ({said})", START_HINT)
