"""ApiError: an HTTP error whose body says what is wrong and how to fix it."""

from __future__ import annotations

from typing import Any

from corral.core.errors import ConfigError

# the largest integer the API takes for an id, a count, a seq or an offset: what a 32-bit INTEGER
# column of PostgreSQL holds (a larger one would fail in the database instead of at the door)
MAX_INT = 2**31 - 1
# the largest seq a paging cursor (`after`, `before`) may name: JavaScript's largest safe
# integer, which the dashboard sends to ask for the newest (a comparison, never stored)
MAX_CURSOR = 2**53


class ApiError(Exception):
    """Answered as `{"error": ..., "fix": ..., "code": ...}` with `status`."""

    @classmethod
    def of_config(cls, exc: ConfigError, status: int = 422) -> ApiError:
        """A ConfigError's place and message as `error`, its fix as `fix`."""
        place = ": ".join(p for p in (exc.source, exc.where) if p)
        return cls(status, f"{place}: {exc.detail}" if place else exc.detail, fix=exc.fix)

    def __init__(self, status: int, message: str, *, fix: str = "", code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fix = fix
        self.code = code

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message}
        if self.fix:
            out["fix"] = self.fix
        if self.code:
            out["code"] = self.code
        return out
