"""Which of the node's GPUs are unhealthy, and why (issue 6: GPU health).

- Declared faults, for tests and for an operator who knows better than NVML:
  `corral agent --fail-gpu 3` (repeatable), and the file `DATA_DIR/gpu-faults`, read at every
  heartbeat: one GPU per line, `INDEX [REASON]` (remove a line to declare the GPU healthy again).
- NVML, where the node has it: uncorrectable ECC errors (volatile), pending retired pages,
  row-remapping failures, and critical XID events (48 double-bit ECC, 63/64 row remapping,
  74 NVLink, 79 fallen off the bus, 92-95 ECC and contained/uncontained errors). An XID is
  remembered until the agent restarts (a reset GPU comes back with a new agent). When NVML itself
  fails, every GPU is unhealthy: the node's state is unknown.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("corral.agent")

FAULTS = "gpu-faults"
CRITICAL_XIDS = {48, 63, 64, 74, 79, 92, 94, 95}


def read_faults(path: Path, gpus: int) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        index, _, reason = line.strip().partition(" ")
        if index.isdigit() and int(index) < gpus:
            out[index] = reason.strip() or "declared faulty"
    return out


class Health:
    def __init__(self, data_dir: Path, gpus: int, declared: dict[str, str], nvml: Any = None) -> None:
        self.file = data_dir / FAULTS
        self.gpus = gpus
        self.declared = {k: v for k, v in declared.items() if k.isdigit() and int(k) < gpus}
        self.nvml = nvml
        self.xids: dict[str, str] = {}
        self._events: Any = None
        if nvml is not None:
            self._watch_xids()

    def unhealthy(self) -> dict[str, str]:
        out = dict(self.declared)
        out.update(read_faults(self.file, self.gpus))
        if self.nvml is not None:
            out.update(self._nvml())
        return out

    def _watch_xids(self) -> None:
        nvml = self.nvml.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for h in self.nvml.handles:
                with contextlib.suppress(Exception):
                    nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
            self._events = events
        except Exception as exc:
            log.warning("NVML: XID events unavailable (%s)", exc)

    def _nvml(self) -> dict[str, str]:
        nvml, out = self.nvml.nvml, {}
        try:
            while self._events is not None:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
                xid = int(event.eventData)
                if xid in CRITICAL_XIDS:
                    index = self.nvml.handles.index(event.device) if event.device in self.nvml.handles else -1
                    if index >= 0:
                        self.xids[str(index)] = f"XID {xid}"
        except Exception:  # NVMLError_Timeout: no event waiting
            pass
        out.update(self.xids)
        try:
            for i, h in enumerate(self.nvml.handles):
                why = self._device(nvml, h)
                if why:
                    out[str(i)] = why
        except Exception as exc:
            return {str(i): f"NVML failed: {exc}" for i in range(self.gpus)}
        return out

    @staticmethod
    def _device(nvml: Any, h: Any) -> str:
        with contextlib.suppress(Exception):
            count = nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
            if count:
                return f"{count} uncorrectable ECC errors"
        with contextlib.suppress(Exception):
            if nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == nvml.NVML_FEATURE_ENABLED:
                return "retired pages pending (reset the GPU)"
        with contextlib.suppress(Exception):
            remap = nvml.nvmlDeviceGetRemappedRows(h)  # (correctable, uncorrectable, pending, failure)
            if remap[3]:
                return "row remapping failed"
            if remap[2]:
                return "row remapping pending (reset the GPU)"
        return ""
