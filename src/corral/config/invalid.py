"""InvalidValue: a ValueError that carries the fix, shared by the config parsers."""

from __future__ import annotations

__all__ = ["InvalidValue"]


class InvalidValue(ValueError):
    """A value that does not parse; `message` says what is wrong and `fix` the correct form."""

    def __init__(self, message: str, fix: str) -> None:
        self.message = message
        self.fix = fix
        super().__init__(f"{message}; {fix}")
