"""Refuses fields a user-written file or request does not define, naming the nearest known one.

Pydantic's models at this edge ignore unknown keys (DESIGN.md 4: readers of the contracts ignore
unknown fields); a job spec or cluster file is written by hand, though, and a typo there
(`gpu_per_replica: 4`) must not silently give a 1-GPU job. `check_known_fields` walks the data
beside the model and raises one ConfigError listing every unknown key, with a suggestion.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Collection, Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from corral.config.yaml_source import FieldPath, Locator
from corral.core.errors import ConfigError

__all__ = ["check_known_fields"]


def check_known_fields(
    data: Mapping[str, Any], model: type[BaseModel], loc: Locator, ignored: Collection[str] = ()
) -> None:
    """ConfigError naming each key of `data` (and of nested models) that `model` does not define.

    `ignored` are top-level keys accepted and dropped (fields a server adds to its own output)."""
    problems: list[ConfigError] = []
    _walk(data, model, (), loc, problems, ignored)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        body = "\n".join(f"  {p}" for p in problems)
        raise ConfigError(f"{len(problems)} problems:\n{body}", source=loc.source)


def _walk(
    data: Mapping[str, Any],
    model: type[BaseModel],
    path: FieldPath,
    loc: Locator,
    problems: list[ConfigError],
    ignored: Collection[str] = (),
) -> None:
    known = model.model_fields
    for key, value in data.items():
        name = str(key)
        if name in known:
            _descend(value, known[name].annotation, (*path, name), loc, problems)
        elif name not in ignored:
            problems.append(loc.error((*path, name), f"unknown field `{name}`", _suggest(name, known)))


def _descend(
    value: object, annotation: object, path: FieldPath, loc: Locator, problems: list[ConfigError]
) -> None:
    """Walk into `value` where the field's type holds a model (directly, in a list, or as dict values)."""
    kind, inner = _model_in(annotation)
    if inner is None:
        return
    if kind == "one" and isinstance(value, Mapping):
        _walk(value, inner, path, loc, problems)
    elif kind == "each" and isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, Mapping):
                _walk(item, inner, (*path, i), loc, problems)
    elif kind == "values" and isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Mapping):
                _walk(item, inner, (*path, str(key)), loc, problems)


def _model_in(annotation: object) -> tuple[str, type[BaseModel] | None]:
    """("one" | "each" | "values", the model) for `M`, `M | None`, `list[M]`, `dict[str, M]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "one", annotation
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        for arg in args:
            found = _model_in(arg)
            if found[1] is not None:
                return found
    if origin in (list, tuple) and args and _model_in(args[0])[0] == "one":
        return "each", _model_in(args[0])[1]
    if origin is dict and len(args) == 2 and _model_in(args[1])[0] == "one":
        return "values", _model_in(args[1])[1]
    return "", None


def _suggest(name: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`?"
    return f"remove it; the known fields here are: {', '.join(sorted(known))}"
