"""How busy the machine was while something was measured, so timings can be judged.

A timing taken while other programs compete for the cores says little about the schedule;
:class:`LoadMonitor` records, over a ``with`` block, the load average and how many cores'
worth of CPU time went to processes other than this one and the children it has waited
for (``others_cores``: 0 on a quiet machine). Linux only (``/proc``); elsewhere the
fields are None.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_seconds() -> float | None:
    """CPU seconds all processes have used since boot (``/proc/stat``, idle and iowait excluded)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / _TICKS


def _own_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class LoadMonitor:
    """Context manager; after the block, :attr:`result` says how busy the machine was."""

    def __init__(self) -> None:
        self.result: dict[str, Any] = {}

    def __enter__(self) -> LoadMonitor:
        self._start = (time.perf_counter(), _busy_seconds(), _own_seconds(), _loadavg())
        return self

    def __exit__(self, *exc: object) -> None:
        wall0, busy0, own0, load0 = self._start
        wall = time.perf_counter() - wall0
        busy1, own1 = _busy_seconds(), _own_seconds()
        cores = os.cpu_count() or 1
        others = None
        if busy0 is not None and busy1 is not None and wall > 0:
            others = max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
        self.result = {
            "seconds": wall,
            "cores": cores,
            "loadavg_start": load0,
            "loadavg_end": _loadavg(),
            "own_cores": (own1 - own0) / wall if wall > 0 else None,
            "others_cores": others,
        }


def describe(load: dict[str, Any]) -> str:
    """One line for a report: the cores others used, and the load average."""
    if load.get("others_cores") is None:
        return "machine load unknown (no /proc)"
    quiet = "quiet" if load["others_cores"] < 0.1 else "NOT quiet"
    return (
        f"machine {quiet}: other processes used {load['others_cores']:.2f} of "
        f"{load['cores']} cores; load average {load['loadavg_start']:.2f} -> "
        f"{load['loadavg_end']:.2f}"
    )
