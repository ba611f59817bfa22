"""The arguments of a plugin that takes none."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NoArgs:
    """No arguments: `{}` is the only valid configuration."""
