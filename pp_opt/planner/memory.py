"""A schedule's peak memory per device as a framework reports it, and its named terms.

The terms come from the profiler (:func:`pp_opt.profiler.memory_peak.device_peaks`): no
multiplier on the total; what torchtitan reports is the ``reserved`` sum (max reserved),
what Megatron-Core and NeMo report the ``allocated`` one.
"""

from __future__ import annotations

from pp_opt.profiler.costs import CostProfile
from pp_opt.profiler.memory_peak import device_peaks
from pp_opt.schedule import Schedule

REPORTED = "reserved"
"""Which sum a peak is reported as (torchtitan's max reserved)."""


def memory_breakdown(profile: CostProfile, schedule: Schedule) -> list[dict[str, float]]:
    """Per pipeline rank, the named terms of its peak and their sums (bytes)."""
    return device_peaks(profile, schedule)


def reported_peak_memory(profile: CostProfile, schedule: Schedule) -> list[float]:
    """Per device: the schedule's peak as reported (:data:`REPORTED` bytes)."""
    return [rank[REPORTED] for rank in memory_breakdown(profile, schedule)]
