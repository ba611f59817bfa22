"""`Client`: one synchronous httpx session against a Corral server, a method per `/v1` route.

Methods return the API's JSON objects unchanged (readers ignore fields they do not know).
A refusal raises `ClientError` (client/errors.py) built from the server's body `{"error", "fix",
"code"}`; a server that cannot be reached raises one with `status == UNREACHABLE` that says how
to start it. `server` may name several replicas, "URL1,URL2": client/failover.py picks one and
moves on when it fails; `submit` sends an `Idempotency-Key` so that it may be sent twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from corral.client.errors import UNREACHABLE, ClientError, refusal
from corral.client.failover import Failover

__all__ = ["DEFAULT_SERVER", "UNREACHABLE", "Client", "ClientError", "JsonObject"]

DEFAULT_SERVER = "http://127.0.0.1:8400"
PAGE = 1000  # jobs or events asked for per request when paging

JsonObject = dict[str, Any]


class Client:
    """A session with a server, or with any of several replicas (`server` = "URL1,URL2,...",
    client/failover.py); use as a context manager, or call `close()`."""

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = Failover(server, headers, timeout, transport)
        self.servers = self._http.urls
        self.timeout = timeout

    @property
    def server(self) -> str:
        """The address in use now (the first that answered of those given)."""
        return self._http.url

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: object = None,
        wait: float = 0.0,
        headers: Mapping[str, str] | None = None,
        repeatable: bool | None = None,
    ) -> Any:
        """One call; the decoded JSON answer. `wait` (long polls) is added to the timeout."""
        return self.response(
            method, path, params=params, body=body, wait=wait, headers=headers, repeatable=repeatable
        ).json()

    def response(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: object = None,
        wait: float = 0.0,
        headers: Mapping[str, str] | None = None,
        repeatable: bool | None = None,
    ) -> httpx.Response:
        """One call; the successful response (ClientError for a refusal or no answer). With
        several servers it may go to the next one (client/failover.py says when)."""
        response = self._http.send(
            method, path, params=params, body=body, headers=headers, wait=wait, repeatable=repeatable
        )
        if not response.is_success:
            raise refusal(response)
        return response

    def job_log(
        self, job_id: str, rank: int = 0, attempt: int | None = None, offset: int = 0
    ) -> tuple[bytes, int, int]:
        """A chunk of a rank's log from `offset`: (bytes, the log's size now, the attempt read)."""
        params: dict[str, Any] = {"rank": rank, "offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        response = self.response("GET", f"/v1/jobs/{job_id}/logs", params=params)
        size = int(response.headers.get("X-Corral-Size", "0"))
        return response.content, size, int(response.headers.get("X-Corral-Attempt", attempt or 1))

    # ---- health and agents -----------------------------------------------------------------
    def healthz(self) -> JsonObject:
        out: JsonObject = self.request("GET", "/healthz")
        return out

    def register_agent(self, inventory: Mapping[str, Any]) -> JsonObject:
        """Register a node (an agent token bound to it, or an admin token): its incarnation."""
        out: JsonObject = self.request("POST", "/v1/agents/register", body=dict(inventory))
        return out

    def heartbeat(
        self,
        node: str,
        incarnation: int,
        gpus: list[dict[str, Any]] | None = None,
        unhealthy: dict[str, str] | None = None,
        unclean: list[str] | None = None,
    ) -> JsonObject:
        """Renew the node's lease; says its GPUs' NVML figures, which are unhealthy, and which
        attempts left processes it could not kill."""
        body: dict[str, Any] = {"incarnation": incarnation}
        if unclean is not None:
            body["unclean"] = unclean
        if gpus is not None:
            body["gpus"] = gpus
        if unhealthy is not None:
            body["unhealthy"] = unhealthy
        # a heartbeat renews a lease: sending it again (to another replica) is harmless
        out: JsonObject = self.request("POST", f"/v1/agents/{node}/heartbeat", body=body, repeatable=True)
        return out

    # ---- jobs ------------------------------------------------------------------------------
    def submit(self, spec: Mapping[str, Any], key: str | None = None) -> JsonObject:
        """Submit a job spec (DESIGN.md 4.2); the job object, as `job()` returns it. The request
        carries an `Idempotency-Key` (`key`, else a fresh UUID), so that it may be sent again, to
        this or another replica, without making a second job."""
        headers = {"Idempotency-Key": key or str(uuid.uuid4())}
        out: JsonObject = self.request("POST", "/v1/jobs", body=dict(spec), headers=headers)
        return out

    def jobs(
        self,
        *,
        state: list[str] | None = None,
        queue: str | None = None,
        user: str | None = None,
        limit: int = PAGE,
        after: int = 0,
        array: str | None = None,
    ) -> list[JsonObject]:
        """One page of jobs, oldest first; each has a `seq` to pass as `after` for the next page.

        `state` may include `active` (pending or live); no state means every state."""
        params: dict[str, Any] = {"limit": limit, "after": after}
        if state:
            params["state"] = state
        if queue:
            params["queue"] = queue
        if user:
            params["user"] = user
        if array:
            params["array"] = array
        out: list[JsonObject] = self.request("GET", "/v1/jobs", params=params)["jobs"]
        return out

    def iter_jobs(
        self,
        *,
        state: list[str] | None = None,
        queue: str | None = None,
        user: str | None = None,
        array: str | None = None,
    ) -> Iterator[JsonObject]:
        """Every matching job, oldest first, fetched page by page (`array`: one array's tasks)."""
        after = 0
        while True:
            page = self.jobs(state=state, queue=queue, user=user, limit=PAGE, after=after, array=array)
            yield from page
            if len(page) < PAGE:
                return
            after = page[-1]["seq"]

    def job(self, job_id: str) -> JsonObject:
        out: JsonObject = self.request("GET", f"/v1/jobs/{job_id}")
        return out

    def acct(self, *, after: str = "0.0", limit: int = PAGE, **filters: Any) -> JsonObject:
        """One page of accounting rows (`corral acct`): `{"rows": [...], "next": cursor or None}`;
        `filters`: user, queue, state (a list), since and until (Unix times)."""
        params = {
            "after": after,
            "limit": limit,
            **{k: v for k, v in filters.items() if v not in (None, [], "")},
        }
        out: JsonObject = self.request("GET", "/v1/acct", params=params)
        return out

    def job_events(self, job_id: str) -> JsonObject:
        """`{"events": [...], "reasons": [{"t", "code", "message"}...]}` for one job."""
        out: JsonObject = self.request("GET", f"/v1/jobs/{job_id}/events")
        return out

    def _job_action(self, job_id: str, action: str) -> JsonObject:
        out: JsonObject = self.request("POST", f"/v1/jobs/{job_id}/{action}")
        return out

    def cancel(self, job_id: str) -> JsonObject:
        """Cancel: a pending job at once; a running one is told to checkpoint and stop."""
        return self._job_action(job_id, "cancel")

    def hold(self, job_id: str) -> JsonObject:
        return self._job_action(job_id, "hold")

    def release(self, job_id: str) -> JsonObject:
        return self._job_action(job_id, "release")

    def requeue(self, job_id: str) -> JsonObject:
        return self._job_action(job_id, "requeue")

    # ---- nodes -----------------------------------------------------------------------------
    def nodes(self, gpus: bool = False) -> list[JsonObject]:
        """Every node; with `gpus`, each node's `gpu_list` (state, job, NVML figures per GPU)."""
        params = {"gpus": "true"} if gpus else None
        out: list[JsonObject] = self.request("GET", "/v1/nodes", params=params)["nodes"]
        return out

    def _node_action(self, name: str, action: str, body: JsonObject) -> JsonObject:
        out: JsonObject = self.request("POST", f"/v1/nodes/{name}/{action}", body=body)
        return out

    def cordon(self, name: str, reason: str = "") -> JsonObject:
        return self._node_action(name, "cordon", {"reason": reason})

    def drain(self, name: str, deadline: float | None = None, reason: str = "") -> JsonObject:
        """No new work; the node's jobs are checkpointed and requeued `deadline` seconds from now."""
        return self._node_action(name, "drain", {"reason": reason, "deadline": deadline})

    def undrain(self, name: str) -> JsonObject:
        return self._node_action(name, "undrain", {})

    def forget(self, name: str) -> JsonObject:
        """Revoke the agent tokens bound to the node (admins): a new join token may then register it."""
        return self._node_action(name, "forget", {})

    def uncordon(self, name: str) -> JsonObject:
        return self._node_action(name, "uncordon", {})

    # ---- queues and configuration revisions ------------------------------------------------
    def queues(self) -> list[JsonObject]:
        out: list[JsonObject] = self.request("GET", "/v1/queues")["queues"]
        return out

    def set_queue(
        self,
        name: str,
        change: Mapping[str, Any],
        comment: str = "",
        decision: Mapping[str, Any] | None = None,
    ) -> JsonObject:
        """Change (or add) queue `name` with the given fields; `{"revision": N}`. `decision`: the
        evidence (`{"evidence": {...}}`) or `{"force": true, "reason": ...}` (server/evidence.py)."""
        body = {k: v for k, v in change.items() if v is not None}
        if comment:
            body["comment"] = comment
        body.update(decision or {})
        out: JsonObject = self.request("PUT", f"/v1/queues/{name}", body=body)
        return out

    def config(self) -> JsonObject:
        out: JsonObject = self.request("GET", "/v1/config")
        return out

    def revision(self, number: int) -> JsonObject:
        """One configuration revision: its body, author, comment and evidence (admins)."""
        out: JsonObject = self.request("GET", f"/v1/config/revisions/{number}")
        return out

    def reports(self) -> JsonObject:
        """Simulation and what-if reports the server's dashboard lists, and (admins) its folder."""
        out: JsonObject = self.request("GET", "/v1/reports")
        return out

    def revisions(self) -> JsonObject:
        """`{"active": N, "revisions": [{"revision", "created_at", "author", "comment"}...]}`."""
        out: JsonObject = self.request("GET", "/v1/config/revisions")
        return out

    def policy(self) -> JsonObject:
        """The policy in effect: `{"name", "args", "plugins", "revision", "source"}`."""
        out: JsonObject = self.request("GET", "/v1/policy")
        return out

    def set_policy(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        comment: str = "",
        decision: Mapping[str, Any] | None = None,
    ) -> JsonObject:
        """Make `name` (with plugin `args`) the scheduling policy, as a new configuration revision."""
        body = {"name": name, "args": args, "comment": comment, **(decision or {})}
        out: JsonObject = self.request("PUT", "/v1/policy", body=body)
        return out

    def history(self, since: float, until: float | None = None) -> JsonObject:
        """The event log of a window as trace rows, with the nodes and configuration (admins)."""
        params: dict[str, Any] = {"since": since}
        if until is not None:
            params["until"] = until
        out: JsonObject = self.request("GET", "/v1/history", params=params)
        return out

    def rollback(self, revision: int) -> JsonObject:
        out: JsonObject = self.request("POST", "/v1/config/rollback", body={"revision": revision})
        return out

    # ---- the event log, audit, usage -------------------------------------------------------
    def events(self, *, after: int = 0, limit: int = PAGE, wait: float = 0.0) -> list[JsonObject]:
        """Events of DESIGN.md 4.6 with `seq > after`; waits up to `wait` s (at most 60) for one."""
        out: list[JsonObject] = self.request(
            "GET", "/v1/events", params={"after": after, "limit": limit, "wait": wait}, wait=wait
        )
        return out

    def audit(self, *, limit: int = 200, after: int = 0, **filters: Any) -> list[JsonObject]:
        """Audit records; `filters`: who, action (a substring), since and until (Unix times)."""
        params = {"limit": limit, "after": after, **{k: v for k, v in filters.items() if v}}
        out: list[JsonObject] = self.request("GET", "/v1/audit", params=params)["audit"]
        return out

    def usage(self, *, since: float = 0.0) -> list[JsonObject]:
        """GPU-hours per queue and user since the Unix time `since`."""
        out: list[JsonObject] = self.request("GET", "/v1/usage", params={"since": since})["usage"]
        return out

    # ---- tokens and admin verbs ------------------------------------------------------------
    def create_token(
        self,
        name: str,
        role: str,
        *,
        team: str = "",
        node: str = "",
        run_as: str = "",
        allow_root: bool = False,
    ) -> JsonObject:
        """A new token; the secret (`token`) is in this answer only."""
        body: JsonObject = {"name": name, "role": role, "team": team, "node": node, "run_as": run_as}
        if allow_root:
            body["allow_root"] = True
        out: JsonObject = self.request("POST", "/v1/tokens", body=body)
        return out

    def tokens(self) -> list[JsonObject]:
        out: list[JsonObject] = self.request("GET", "/v1/tokens")["tokens"]
        return out

    def revoke_token(self, token_id: str) -> JsonObject:
        out: JsonObject = self.request("DELETE", f"/v1/tokens/{token_id}")
        return out

    def pause(self) -> JsonObject:
        """Freeze scheduling decisions (running jobs are untouched)."""
        out: JsonObject = self.request("POST", "/v1/admin/pause")
        return out

    def resume(self) -> JsonObject:
        out: JsonObject = self.request("POST", "/v1/admin/resume")
        return out

    def maintenance(self, seconds: float) -> JsonObject:
        """Extend every node's lease through a planned control-plane outage of `seconds` (0 ends it)."""
        out: JsonObject = self.request("POST", "/v1/admin/maintenance", body={"seconds": seconds})
        return out

    def backup(self, path: str) -> JsonObject:
        """An online copy of the database to `path` on the server's machine."""
        out: JsonObject = self.request("POST", "/v1/admin/backup", body={"path": path})
        return out
