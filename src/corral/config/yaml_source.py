"""Line-aware YAML loading, and ConfigErrors that name the file, the line, the field and the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from corral.config.invalid import InvalidValue
from corral.core.errors import ConfigError

__all__ = ["FieldPath", "Lines", "Locator", "format_path", "load_yaml"]

FieldPath = tuple[str | int, ...]
Lines = dict[FieldPath, int]
"""1-based line of every mapping key and sequence item, by field path."""


def load_yaml(path: str | Path) -> tuple[object, Lines]:
    """The document in `path` and the line of each field; ConfigError on unreadable files or bad YAML."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read the file: {reason}", source=source, fix="check the path") from exc
    loader = yaml.SafeLoader(text)
    lines: Lines = {}
    try:
        node = loader.get_single_node()
        if node is None:
            return None, lines
        _record_lines(node, (), lines, source)  # before construction, which rewrites merge keys
        return loader.construct_document(node), lines
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, source) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=source, fix="fix the YAML syntax") from exc
    finally:
        loader.dispose()


def _syntax_error(exc: yaml.MarkedYAMLError, source: str) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    problem = "; ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
    return ConfigError(
        f"invalid YAML: {problem}",
        source=where,
        fix="check indentation, colons and brackets on this line or the one before",
    )


def _record_lines(node: yaml.Node, path: FieldPath, lines: Lines, source: str) -> None:
    """Walk the composed node tree alongside the data, recording where each field starts."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                continue
            sub = (*path, str(key_node.value))
            if sub in lines:
                raise ConfigError(
                    f"duplicate key {key_node.value!r}",
                    source=f"{source}:{key_node.start_mark.line + 1}",
                    where=format_path(path) or "",
                    fix="keep one of the two entries",
                )
            lines[sub] = key_node.start_mark.line + 1
            _record_lines(value_node, sub, lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _record_lines(item, (*path, index), lines, source)


def format_path(path: Sequence[str | int]) -> str:
    """`("nodes", 1, "labels", "leaf")` -> `nodes[1].labels.leaf`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclass(frozen=True, slots=True)
class Locator:
    """Turns a field path into `file:line` and builds ConfigErrors that point there."""

    source: str
    lines: Mapping[FieldPath, int] = field(default_factory=dict)

    def line(self, path: Sequence[str | int]) -> int | None:
        """The line of the field, or of its nearest enclosing field that has one."""
        key = tuple(path)
        while True:
            if key in self.lines:
                return self.lines[key]
            if not key:
                return None
            key = key[:-1]

    def error(self, path: Sequence[str | int], message: str, fix: str) -> ConfigError:
        line = self.line(path)
        source = f"{self.source}:{line}" if line is not None and self.source else self.source
        return ConfigError(message, source=source, where=format_path(path), fix=fix)

    def invalid(self, path: Sequence[str | int], exc: InvalidValue) -> ConfigError:
        return self.error(path, exc.message, exc.fix)

    def validation_error(self, exc: ValidationError) -> ConfigError:
        """One readable line per pydantic error, each with its line, field path and fix."""
        details = sorted(exc.errors(), key=lambda d: self.line(tuple(d["loc"])) or 0)
        errors = [self._one(detail) for detail in details]
        if len(errors) == 1:
            return errors[0]
        body = "\n".join(f"  {error}" for error in errors)
        return ConfigError(f"{len(errors)} problems:\n{body}", source=self.source)

    def _one(self, detail: ErrorDetails) -> ConfigError:
        path = tuple(detail["loc"])
        ctx: dict[str, Any] = dict(detail.get("ctx") or {})
        cause = ctx.get("error")
        if isinstance(cause, InvalidValue):
            return self.invalid(path, cause)
        message, fix = _describe(detail, ctx, path)
        return self.error(path, message, fix)


_FIXES = {
    "int_type": "write a whole number",
    "int_from_float": "write a whole number",
    "int_parsing": "write a whole number",
    "float_type": "write a number",
    "float_parsing": "write a number",
    "string_type": "write a string (quote it if it looks like a number or a boolean)",
    "bool_type": "write true or false",
    "list_type": "write a list, e.g. [a, b]",
    "tuple_type": "write a list, e.g. [a, b]",
    "dict_type": "write a mapping of key: value pairs",
    "model_type": "write a mapping of key: value pairs",
    "model_attributes_type": "write a mapping of key: value pairs",
}


def _describe(detail: ErrorDetails, ctx: Mapping[str, Any], path: FieldPath) -> tuple[str, str]:
    kind = detail["type"]
    got = detail.get("input")
    shown = f", got {got!r}" if isinstance(got, str | int | float | bool) or got is None else ""
    if kind == "missing":
        name = path[-1] if path else "field"
        return "required field is missing", f"add `{name}:`"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        return f"must be {bounds[kind]} {limit}{shown}", f"use a value {bounds[kind]} {limit}"
    if kind in {"literal_error", "enum"}:
        return f"invalid value{shown}", f"use one of {ctx.get('expected', '')}"
    if kind == "value_error":
        return str(ctx.get("error", detail["msg"])), "see the documentation of this field"
    fix = _FIXES.get(kind, "see the documentation of this field")
    return f"{detail['msg']}{shown}", fix
