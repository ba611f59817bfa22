"""What this node has: GPUs declared or found through NVML, CPUs, memory, and its address."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from corral.config.gpu_models import normalise_gpu_model


@dataclass(frozen=True)
class Gpus:
    """The node's GPUs, and why it has none when it has none."""

    count: int
    model: str = ""
    memory_gib: float = 0.0
    why_none: str = ""
    nvlink: list[list[int]] = field(default_factory=list)  # NVLink domains, as GPU indices
    uuids: list[str] = field(default_factory=list)


def detect_gpus() -> Gpus:
    """The NVIDIA GPUs NVML sees (through nvidia-ml-py, when it is installed): their model (of GPU
    0; a node's GPUs are one model), memory, UUIDs and NVLink domains."""
    from corral.agent.nvml import nvlink_domains, open_nvml

    nvml, why = open_nvml()
    if nvml is None:
        return Gpus(0, why_none=why)
    try:
        devices = nvml.devices()
    except Exception as exc:
        return Gpus(0, why_none=f"NVML: {exc}")
    finally:
        nvml.close()
    first = devices[0]
    return Gpus(
        len(devices),
        normalise_gpu_model(first.name),
        round(first.memory_bytes / 2**30, 1),
        nvlink=nvlink_domains(devices),
        uuids=[d.uuid for d in devices],
    )


def declared_or_detected(gpus: int | None, gpu_model: str | None) -> Gpus:
    """`--gpus N --gpu-model M` when given, else what NVML finds (its model overridable)."""
    model = normalise_gpu_model(gpu_model) if gpu_model else ""
    if gpus is not None:
        return Gpus(gpus, model, why_none="declared with --gpus 0" if gpus == 0 else "")
    found = detect_gpus()
    if model and found.count:
        return Gpus(found.count, model, found.memory_gib, nvlink=found.nvlink, uuids=found.uuids)
    return found


def address_towards(server_url: str) -> str:
    """The local IP address this machine uses to reach the server (no packet is sent)."""
    parts = urlsplit(server_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def inventory(node: str, gpus: Gpus, address: str) -> dict[str, Any]:
    """The registration body of the agents' API."""
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gib = 0.0
    return {
        "node": node,
        "gpus": gpus.count,
        "gpu_model": gpus.model,
        "gpu_memory_gib": gpus.memory_gib,
        "cpus": os.cpu_count() or 0,
        "memory_gib": round(memory_gib, 1),
        "address": address,
        "nvlink": gpus.nvlink,
    }
