"""ApiError: an HTTP error whose body says what is wrong and how to fix it."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Answered as `{"error": ..., "fix": ..., "code": ...}` with `status`."""

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
