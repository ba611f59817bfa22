"""Slurm hostlist expansion: `dgx[01-08]`, `n[1-3,7]`, `a[1-2]b[1-2]`, `a,b[1-2]`."""

from __future__ import annotations

import itertools
import re

from corral.config.invalid import InvalidValue

__all__ = ["expand_hostlist"]

_FORM = "write ranges like dgx[01-08] or n[1-3,7], names separated by commas"
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_PIECE = re.compile(r"(\d+)(?:-(\d+))?")


def expand_hostlist(text: str) -> list[str]:
    """Expand a hostlist into node names, in order; raises InvalidValue (a ValueError)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidValue("the node name is empty", _FORM)
    names: list[str] = []
    for item in _split_top_level(text.strip(), text):
        names.extend(_expand_item(item, text))
    return names


def _split_top_level(text: str, whole: str) -> list[str]:
    """Split at commas outside brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(text):
        if char == "[":
            if depth:
                raise InvalidValue(f"nested '[' in {whole!r}", _FORM)
            depth = 1
        elif char == "]":
            if not depth:
                raise InvalidValue(f"']' without '[' in {whole!r}", _FORM)
            depth = 0
        elif char == "," and not depth:
            items.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise InvalidValue(f"'[' is never closed in {whole!r}", _FORM)
    items.append(text[start:].strip())
    if any(not item for item in items):
        raise InvalidValue(f"empty name between commas in {whole!r}", _FORM)
    return items


def _expand_item(item: str, whole: str) -> list[str]:
    """Expand one comma-free item: literal text and bracketed ranges, as a cartesian product."""
    parts: list[list[str]] = []
    rest = item
    while rest:
        if rest.startswith("["):
            end = rest.index("]")
            parts.append(_expand_ranges(rest[1:end], whole))
            rest = rest[end + 1 :]
            continue
        match = _NAME.match(rest)
        if match is None:
            raise InvalidValue(f"unexpected character {rest[0]!r} in {whole!r}", _FORM)
        parts.append([match.group(0)])
        rest = rest[match.end() :]
    return ["".join(combo) for combo in itertools.product(*parts)]


def _expand_ranges(body: str, whole: str) -> list[str]:
    """Expand the inside of one bracket: `01-08`, `1-3,7`."""
    if not body.strip():
        raise InvalidValue(f"empty brackets in {whole!r}", _FORM)
    out: list[str] = []
    for piece in body.split(","):
        match = _PIECE.fullmatch(piece.strip())
        if match is None:
            raise InvalidValue(
                f"{piece.strip() or 'an empty range'!r} is not a number range in {whole!r}", _FORM
            )
        low_text, high_text = match.group(1), match.group(2)
        if high_text is None:
            out.append(low_text)
            continue
        low, high = int(low_text), int(high_text)
        if low > high:
            raise InvalidValue(
                f"range [{low_text}-{high_text}] runs backwards in {whole!r}",
                f"write the low number first, e.g. [{high_text}-{low_text}]",
            )
        width = len(low_text) if low_text.startswith("0") and len(low_text) > 1 else 0
        out.extend(str(n).zfill(width) for n in range(low, high + 1))
    return out
