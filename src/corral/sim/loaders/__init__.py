"""Loaders that turn the public traces in ../shared/traces into trace jobs, and `convert` for the CLI."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from corral.core.errors import ConfigError
from corral.sim.loaders.gavel import load_gavel
from corral.sim.loaders.location import TRACES_DIR_ENV, shared_traces_dir
from corral.sim.loaders.philly import load_philly
from corral.sim.loaders.pollux import load_pollux, load_sia
from corral.sim.loaders.shockwave import load_shockwave
from corral.sim.loaders.tiresias import load_tiresias
from corral.sim.trace import TraceJob, read_trace, write_trace

__all__ = ["LOADERS", "TRACES_DIR_ENV", "convert", "load", "shared_traces_dir"]

PathLike = str | os.PathLike[str]


def _gavel(path: PathLike, **options: Any) -> list[TraceJob]:
    return load_gavel(path, **options).jobs


def _csv(path: PathLike, *, largest_node_gpus: int) -> list[TraceJob]:
    return read_trace(path, largest_node_gpus=largest_node_gpus)


# source name -> (loader, whether a path or name must be given, the loader whose keywords are the options)
LOADERS: dict[str, tuple[Callable[..., list[TraceJob]], bool, Callable[..., Any]]] = {
    "philly": (load_philly, False, load_philly),
    "pollux": (load_pollux, True, load_pollux),
    "sia": (load_sia, True, load_sia),
    "gavel": (_gavel, True, load_gavel),
    "tiresias": (load_tiresias, False, load_tiresias),
    "shockwave": (load_shockwave, False, load_shockwave),
    "csv": (_csv, True, _csv),
}


def load(source: str, path_or_name: PathLike | None = None, **options: Any) -> list[TraceJob]:
    """The jobs of a trace of a known source; a relative name is looked up in the shared traces too."""
    if source not in LOADERS:
        raise ConfigError(
            f"unknown trace source {source!r}", where="source", fix=f"use one of {', '.join(LOADERS)}"
        )
    loader, needs_path, signature_of = LOADERS[source]
    accepted = [
        p.name for p in inspect.signature(signature_of).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"option(s) {', '.join(unknown)} do not apply to {source} traces",
            where="options",
            fix=f"use {', '.join(accepted) or 'no options'}",
        )
    if path_or_name is None:
        if needs_path:
            raise ConfigError(
                f"{source} needs a trace file", where="path", fix="give a path or a name such as workload-1"
            )
        return loader(**options)
    return loader(path_or_name, **options)


def convert(source: str, path_or_name: PathLike | None, out_path: PathLike, **options: Any) -> int:
    """Convert a trace to the common CSV form at `out_path`; returns the number of jobs written."""
    return write_trace(out_path, load(source, path_or_name, **options))
