"""Stage-to-device maps: ``loop`` (interleaved), ``v`` (two chunks per device), ``dual``
(two copies of the model, one per direction: DeepSeek's DualPipe), or explicit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pp_opt.errors import ProblemError
from pp_opt.limits import check_size

PLACEMENTS = ("loop", "v")


def stage_devices(placement: str | Sequence[int], p: int, v: int) -> tuple[int, ...]:
    """Device of each stage, for a named placement or an explicit list."""
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ProblemError("p", f"got {p!r}; the number of devices must be an integer >= 1")
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProblemError("v", f"got {v!r}; chunks per device must be an integer")
    check_size(p=p, v=v)
    if isinstance(placement, str):
        if placement == "loop":
            if v < 1:
                raise ProblemError("v", f"got {v}; chunks per device must be at least 1")
            return tuple(s % p for s in range(p * v))
        if placement in ("v", "dual"):  # dual: stages p.. are the second copy, devices p-1..0
            if v != 2:
                raise ProblemError(
                    "v", f"got {v}; the '{placement}' placement has exactly 2 chunks per device, "
                    "set v = 2"
                )  # fmt: skip
            return tuple(s if s < p else 2 * p - 1 - s for s in range(2 * p))
        raise ProblemError(
            "placement", f"unknown placement {placement!r}; use 'loop', 'v' or a list of devices"
        )
    if not isinstance(placement, Sequence):
        raise ProblemError("placement", f"got {placement!r}; use 'loop', 'v' or a list of devices")
    for d in placement:
        if isinstance(d, bool) or not isinstance(d, int):
            raise ProblemError(
                "placement", f"entry {d!r} is not a device number; give integers 0..{p - 1}"
            )
    devices = tuple(int(d) for d in placement)
    check_size(v=len(devices) // p)
    if not devices:
        raise ProblemError("placement", "the explicit stage-to-device list is empty")
    bad = [d for d in devices if not 0 <= d < p]
    if bad:
        raise ProblemError(
            "placement", f"device {bad[0]} is outside 0..{p - 1}; every entry must be a device"
        )
    missing = sorted(set(range(p)) - set(devices))
    if missing:
        raise ProblemError(
            "placement", f"device {missing[0]} holds no stage; give every device one"
        )
    return devices


def chunks_per_device(devices: Sequence[int], p: int) -> int:
    """The largest number of stages any device holds (``v`` of an explicit placement)."""
    return max(Counter(devices).values(), default=0)
