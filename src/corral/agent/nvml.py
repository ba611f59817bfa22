"""NVIDIA GPUs through NVML (nvidia-ml-py): what a node has, how its GPUs are linked, how busy they are.

NVML is optional: without the package or a driver, `open_nvml()` returns None and the agent uses
its declared inventory (`--gpus N --gpu-model M`), with no utilisation figures.

NVLink domains: two GPUs are in one domain when an active NVLink joins them directly, or through
an NVSwitch (a link whose far end is not one of the node's GPUs). `nvlink_domains` is a pure
function of the links NVML reports, so it is tested without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, field
from typing import Any

MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS on Hopper; probing past a GPU's last link just fails


@dataclass(frozen=True)
class Device:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    bus_id: str
    links: frozenset[str] = field(default_factory=frozenset)  # PCI bus ids at the far end of active links


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(value: str) -> str:
    """PCI bus ids as NVML spells them vary in domain width (00000000:3B:00.0 / 0000:3b:00.0)."""
    domain, _, rest = value.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else value.lower()


def nvlink_domains(devices: list[Device]) -> list[list[int]]:
    """GPU indices grouped into NVLink domains (connected components; singletons left out)."""
    parent = {d.index: d.index for d in devices}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        parent[find(a)] = find(b)

    by_bus = {_bus(d.bus_id): d.index for d in devices}
    switches: dict[str, int] = {}
    for d in devices:
        for far in d.links:
            peer = by_bus.get(_bus(far))
            if peer is not None:
                union(d.index, peer)
            elif _bus(far) in switches:
                union(d.index, switches[_bus(far)])
            else:
                switches[_bus(far)] = d.index
    if switches:  # every NVSwitch of a node belongs to one fabric (HGX boards)
        first = next(iter(switches.values()))
        for member in switches.values():
            union(first, member)
    groups: dict[int, list[int]] = {}
    for d in devices:
        groups.setdefault(find(d.index), []).append(d.index)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


class Nvml:
    """An initialised NVML; `devices()` once at start, `sample()` at each heartbeat."""

    def __init__(self, module: Any) -> None:
        self.nvml = module
        self._lock = threading.Lock()
        self.handles = [module.nvmlDeviceGetHandleByIndex(i) for i in range(module.nvmlDeviceGetCount())]

    def devices(self) -> list[Device]:
        nvml, out = self.nvml, []
        for i, h in enumerate(self.handles):
            links = set()
            for link in range(MAX_LINKS):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                        continue
                    remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(h, link)
                except Exception:  # NVMLError_NotSupported, InvalidArgument past the last link
                    break
                links.add(_text(remote.busId))
            out.append(
                Device(
                    index=i,
                    uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                    name=_text(nvml.nvmlDeviceGetName(h)),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(h).total),
                    bus_id=_text(nvml.nvmlDeviceGetPciInfo(h).busId),
                    links=frozenset(links),
                )
            )
        return out

    def sample(self) -> list[dict[str, Any]]:
        """Per GPU: utilisation (0 to 1) and memory in use, for the heartbeat and `/metrics`."""
        nvml, out = self.nvml, []
        with self._lock:
            for i, h in enumerate(self.handles):
                row: dict[str, Any] = {"index": i}
                with contextlib.suppress(Exception):
                    row["uuid"] = _text(nvml.nvmlDeviceGetUUID(h))
                    row["utilization"] = nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
                    memory = nvml.nvmlDeviceGetMemoryInfo(h)
                    row["memory_used_bytes"] = int(memory.used)
                    row["memory_total_bytes"] = int(memory.total)
                out.append(row)
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def open_nvml() -> tuple[Nvml | None, str]:
    """(NVML, "") when there is a driver and at least one GPU; else (None, why not)."""
    try:
        module: Any = importlib.import_module("pynvml")
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError: no driver, no library
        return None, f"NVML: {exc}"
    try:
        found = Nvml(module)
    except Exception as exc:
        with contextlib.suppress(Exception):
            module.nvmlShutdown()
        return None, f"NVML: {exc}"
    if not found.handles:
        found.close()
        return None, "NVML sees no GPU"
    return found, ""
