"""GPU model names normalised from NVML's spelling: `NVIDIA H100 80GB HBM3` becomes `H100-80GB`."""

from __future__ import annotations

import re

__all__ = ["normalise_gpu_model"]

_VENDOR = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
_FORM_FACTOR = re.compile(r"SXM\d*|PCIE|HBM\d*E?")
_MEMORY = re.compile(r"(\d+)GB")


def normalise_gpu_model(name: str) -> str:
    """`MODEL[-MEMORY]` in upper case, without vendor, form factor or memory type; idempotent.

    `NVIDIA A100-SXM4-40GB` -> `A100-40GB`, `Tesla V100-SXM2-16GB` -> `V100-16GB`,
    `NVIDIA GeForce RTX 4090` -> `RTX-4090`. Glob characters (`H100*`) pass through.
    """
    tokens = [t for t in re.split(r"[\s\-_]+", name.strip().upper()) if t]
    model: list[str] = []
    memory: list[str] = []
    for token in tokens:
        if token in _VENDOR or _FORM_FACTOR.fullmatch(token):
            continue
        if _MEMORY.fullmatch(token):
            memory.append(token)
        else:
            model.append(token)
    return "-".join(model + memory)
