"""`ClientError`: a refusal from the server (its body `{"error", "fix", "code"}`), or no answer."""

from __future__ import annotations

import httpx

__all__ = ["UNREACHABLE", "ClientError", "refusal"]

UNREACHABLE = 0  # ClientError.status when no HTTP answer came back


class ClientError(Exception):
    """The server refused a request (`status` is its HTTP status), or could not be reached (0)."""

    def __init__(self, status: int, message: str, fix: str = "", code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fix = fix
        self.code = code

    def __str__(self) -> str:
        return f"{self.message} (fix: {self.fix})" if self.fix else self.message

    @property
    def is_unreachable(self) -> bool:
        return self.status == UNREACHABLE


def refusal(response: httpx.Response) -> ClientError:
    """The ClientError of an unsuccessful answer."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return ClientError(
            response.status_code, body["error"], str(body.get("fix") or ""), str(body.get("code") or "")
        )
    if isinstance(body, dict) and "detail" in body:  # a route the server does not have
        detail = body["detail"]
        message = detail if isinstance(detail, str) else str(detail)
        return ClientError(
            response.status_code,
            f"{response.request.method} {response.request.url.path}: {message}",
            "the server may be older than this client: compare `corral version` on both",
        )
    text = response.text.strip().replace("\n", " ")[:200]
    return ClientError(
        response.status_code, f"HTTP {response.status_code} from the server: {text or '(empty)'}"
    )
