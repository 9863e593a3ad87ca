"""The problem data model: devices, stages, costs, memory caps and switches, all checked."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.limits import check_magnitude, check_size
from pp_opt.placement import chunks_per_device, stage_devices

OBJECTIVES = ("makespan", "span")


def _check_number(
    field_name: str, value: Any, *, positive: bool = False, bounded: bool = True
) -> float:
    """A finite number >= 0 (> 0 when ``positive``), at most :data:`~pp_opt.limits.MAX_VALUE`
    when ``bounded`` (caps are not: a huge cap just means no limit)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProblemError(field_name, f"got {value!r}; expected a number")
    number = float(value)
    if not math.isfinite(number):
        raise ProblemError(field_name, f"got {number}; expected a finite number")
    if bounded:
        check_magnitude(field_name, number)
    if number < 0 or (positive and number == 0):
        need = "greater than 0" if positive else "0 or more"
        raise ProblemError(field_name, f"got {number:g}; it must be {need}")
    return number


@dataclass(kw_only=True, slots=True, frozen=True)
class Stage:
    """Costs of one microbatch on one pipeline stage."""

    device: int
    """Device (GPU) that runs this stage."""
    t_f: float
    """Forward time."""
    t_b: float
    """Backward time with respect to the input (the gradient passed upstream)."""
    t_w: float
    """Backward time with respect to the weights."""
    t_bw: float | None = None
    """Fused backward time when the split is off; ``t_b + t_w`` when not given."""
    m_b: float = 1.0
    """Activation memory one forward keeps until its backward."""
    m_w: float = 0.0
    """Part of ``m_b`` still needed by ``W`` after ``B``."""
    m_in: float = 0.0
    """Memory kept when the forward is recomputed instead (the stage input)."""
    t_offload: float = 0.0
    """Device-to-host copy time of the whole activation ``m_b``."""
    t_reload: float = 0.0
    """Host-to-device copy time of the whole activation ``m_b``."""
    t_f_comm: float = 0.0
    """Part of ``t_f`` that is communication (the MoE all-to-all, TP/CP collectives): an
    overlapped pair (:func:`pp_opt.ops.pair_time`) hides it under the other half's compute."""
    t_b_comm: float = 0.0
    """Part of ``t_b`` that is communication (as ``t_f_comm``, for the backward)."""

    def __post_init__(self) -> None:
        if isinstance(self.device, bool) or not isinstance(self.device, int) or self.device < 0:
            raise ProblemError(
                "device", f"got {self.device!r}; give the stage's device as an integer >= 0"
            )
        for name in ("t_f", "t_b", "t_w", "m_b", "m_w", "m_in", "t_offload", "t_reload",
                     "t_f_comm", "t_b_comm"):  # fmt: skip
            _check_number(name, getattr(self, name))
        for name, whole in (("t_f_comm", "t_f"), ("t_b_comm", "t_b")):
            if getattr(self, name) > getattr(self, whole):
                raise ProblemError(
                    name,
                    f"got {getattr(self, name):g} > {whole} = {getattr(self, whole):g}; "
                    f"it is the part of {whole} that is communication",
                )
        if self.t_bw is not None:
            _check_number("t_bw", self.t_bw)
        if self.m_w > self.m_b:
            raise ProblemError("m_w", f"got {self.m_w:g} > m_b = {self.m_b:g}; m_w is part of m_b")
        if self.m_in > self.m_b:
            raise ProblemError(
                "m_in", f"got {self.m_in:g} > m_b = {self.m_b:g}; m_in is part of m_b"
            )

    @property
    def fused_backward(self) -> float:
        return self.t_b + self.t_w if self.t_bw is None else self.t_bw


@dataclass(kw_only=True, slots=True, frozen=True)
class Device:
    """Memory of one device: the cap applies to static plus activation memory."""

    cap: float
    """Memory cap (activations plus static memory)."""
    static: float = 0.0
    """Parameters, gradients, optimizer state and workspace: always resident."""

    def __post_init__(self) -> None:
        _check_number("cap", self.cap, bounded=False)
        _check_number("static", self.static)
        if self.cap < self.static:
            raise ProblemError(
                "cap", f"got {self.cap:g} < static memory {self.static:g}; raise cap above static"
            )


@dataclass(kw_only=True, slots=True, frozen=True)
class Problem:
    """One training iteration to schedule: ``p`` devices, ``m`` microbatches, its stages."""

    p: int
    """Number of devices (pipeline ranks)."""
    m: int
    """Number of microbatches."""
    stages: tuple[Stage, ...]
    """Per-stage costs, in pipeline order; ``stages[s].device`` is the placement."""
    devices: tuple[Device, ...]
    """Per-device memory cap and static memory."""
    placement: str = "loop"
    """``loop``, ``v``, ``dual`` or ``explicit`` (how ``stages[s].device`` was chosen).
    ``dual`` (DeepSeek's DualPipe) holds two copies of a ``p``-stage model: stages ``0..p-1``
    on devices ``0..p-1`` and stages ``p..2p-1`` on devices ``p-1..0``; the first half of
    the microbatches runs through the first copy, the second half through the other
    (:meth:`routes`)."""
    t_comm: float = 0.0
    """Latency of every dependency between ops on different devices."""
    host_links: tuple[tuple[int, ...], ...] = ()
    """Groups of devices whose offload/reload copies share one host link."""
    split_backward: bool = True
    """Split backward into ``B`` and ``W``; off means one fused ``BW`` op."""
    offload: bool = False
    """Allow offloading activations to host memory (and reloading them)."""
    recompute: bool = False
    """Allow recomputing a forward instead of keeping its activation."""
    pairs: bool = False
    """Allow overlapped pairs ``FB``: the ``F`` of one microbatch run together with the
    backward of another on the same device (docs/design.md §3), hiding each one's
    communication (``t_f_comm``, ``t_b_comm``) under the other's compute."""
    pair_overhead: float = 0.0
    """Fraction by which an overlapped pair's compute runs slower while the other half's
    communication runs beside it (:func:`pp_opt.ops.pair_time`)."""
    objective: str = "makespan"
    """``makespan`` (synchronous optimizer step) or ``span`` (max per-device span)."""
    unit: str = "m_b"
    """Unit of memory numbers: ``m_b`` (multiples of one activation) or ``bytes``."""
    name: str = ""
    """A label for reports."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Provenance kept with the problem (e.g. the profile it came from); not used to solve."""

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, int) or self.p < 1:
            raise ProblemError(
                "p", f"got {self.p!r}; the number of devices must be an integer >= 1"
            )
        if isinstance(self.m, bool) or not isinstance(self.m, int) or self.m < 1:
            raise ProblemError(
                "m", f"got {self.m!r}; the number of microbatches must be an integer >= 1"
            )
        for name, items, kind in (
            ("stages", self.stages, Stage),
            ("devices", self.devices, Device),
        ):
            if not isinstance(items, tuple) or not all(isinstance(x, kind) for x in items):
                raise ProblemError(name, f"expected a tuple of {kind.__name__} objects")
        check_size(p=self.p, m=self.m, stages=len(self.stages))
        if len(self.devices) != self.p:
            raise ProblemError(
                "devices", f"got {len(self.devices)} entries for p = {self.p}; give one per device"
            )
        if not self.stages:
            raise ProblemError("stages", "no stages; give at least one per device")
        devs = [s.device for s in self.stages]
        if self.placement == "dual" and self.m % 2:
            raise ProblemError(
                "m", f"got {self.m}; the dual placement feeds half the microbatches from each "
                "end: give an even number"
            )  # fmt: skip
        if self.placement in ("loop", "v", "dual"):
            expected = stage_devices(self.placement, self.p, self.v)
            if tuple(devs) != expected:
                raise ProblemError(
                    "stages",
                    f"stage devices {devs} do not follow placement {self.placement!r}; "
                    "fix the devices or use an explicit placement list",
                )
        elif self.placement == "explicit":
            stage_devices(devs, self.p, 1)
        else:
            raise ProblemError(
                "placement", f"unknown {self.placement!r}; use 'loop', 'v' or a list of devices"
            )
        _check_number("t_comm", self.t_comm)
        if self.objective not in OBJECTIVES:
            raise ProblemError("objective", f"unknown {self.objective!r}; use 'makespan' or 'span'")
        _check_number("pair_overhead", self.pair_overhead)
        for name in ("split_backward", "offload", "recompute", "pairs"):
            if not isinstance(getattr(self, name), bool):
                raise ProblemError(name, f"got {getattr(self, name)!r}; expected true or false")
        if not isinstance(self.name, str):
            raise ProblemError("name", f"got {self.name!r}; expected a string")
        if self.unit not in ("m_b", "bytes"):
            raise ProblemError("unit", f"unknown {self.unit!r}; use 'm_b' or 'bytes'")
        if not isinstance(self.extra, dict):
            raise ProblemError("extra", f"got {type(self.extra).__name__}; expected a dict")
        if not isinstance(self.host_links, tuple) or not all(
            isinstance(g, tuple) for g in self.host_links
        ):
            raise ProblemError(
                "host_links", f"got {self.host_links!r:.60}; expected a tuple of device tuples"
            )
        seen: set[int] = set()
        for group in self.host_links:
            for d in group:
                if isinstance(d, bool) or not isinstance(d, int):
                    raise ProblemError("host_links", f"entry {d!r:.30} is not a device number")
                if not 0 <= d < self.p:
                    raise ProblemError("host_links", f"device {d} is outside 0..{self.p - 1}")
                if d in seen:
                    raise ProblemError("host_links", f"device {d} is in two host-link groups")
                seen.add(d)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def v(self) -> int:
        """Chunks (stages) per device."""
        return chunks_per_device([s.device for s in self.stages], self.p)

    def routes(self) -> list[tuple[range, range]]:
        """``(stages, microbatches)``: the stages each group of microbatches runs through,
        in order. All microbatches run through all stages, but in the ``dual`` placement."""
        if self.placement != "dual":
            return [(range(self.num_stages), range(self.m))]
        half, p = self.m // 2, self.p
        return [(range(p), range(half)), (range(p, 2 * p), range(half, self.m))]

    def device_of(self, stage: int) -> int:
        return self.stages[stage].device

    def stages_on(self, device: int) -> list[int]:
        return [s for s, st in enumerate(self.stages) if st.device == device]

    def link_group(self, device: int) -> int | None:
        """Index of the host-link group of ``device``, or None if its link is its own."""
        for i, group in enumerate(self.host_links):
            if device in group:
                return i
        return None

    def activation_room(self, device: int) -> float:
        """Memory for activations on ``device``: cap minus static memory, but at most twice
        all of its activations together (a larger cap is no limit; twice leaves room for
        rounding), so that a huge cap stays a small number in the solvers' integer models."""
        dev = self.devices[device]
        everything = self.m * sum(st.m_b for st in self.stages if st.device == device)
        return min(dev.cap - dev.static, 2.0 * everything)

    def replace(self, **changes: Any) -> Problem:
        return replace(self, **changes)


def uniform_problem(
    *,
    p: int,
    m: int,
    t_f: float = 1.0,
    t_b: float = 1.0,
    t_w: float = 1.0,
    m_b: float = 1.0,
    m_w: float = 0.0,
    t_comm: float = 0.0,
    cap: float | None = None,
    static: float = 0.0,
    placement: str = "loop",
    v: int = 1,
    **options: Any,
) -> Problem:
    """A problem with the same costs on every stage (per-chunk costs are divided by ``v``).

    The default cap, ``2p`` activations, admits every classic schedule of ``p`` stages.
    """
    for name, value in (("t_f", t_f), ("t_b", t_b), ("t_w", t_w), ("m_b", m_b), ("m_w", m_w),
                        ("t_comm", t_comm), ("static", static)):  # fmt: skip
        _check_number(name, value)
    if cap is not None:
        _check_number("cap", cap, bounded=False)
    devices_of = stage_devices(placement, p, v)
    stage = dict(t_f=t_f / v, t_b=t_b / v, t_w=t_w / v, m_b=m_b / v, m_w=m_w / v)
    stages = tuple(Stage(device=d, **stage) for d in devices_of)
    cap_value = float(2 * p * m_b + static) if cap is None else float(cap)
    devices = tuple(Device(cap=cap_value, static=static) for _ in range(p))
    return Problem(
        p=p, m=m, stages=stages, devices=devices, placement=placement, t_comm=t_comm, **options
    )
