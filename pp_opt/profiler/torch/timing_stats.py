"""The spread of repeated timings: what every measured cost reports besides its median."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def timing_stats(samples: Sequence[float]) -> dict[str, float]:
    """Median, interquartile range, min, max and count of timings (ms)."""
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {"median": statistics.median(ordered), "iqr": q[2] - q[0], "min": ordered[0],
            "max": ordered[-1], "repeats": len(ordered)}  # fmt: skip
