"""The cost profile JSON (``"format": "pp-opt.costs"``) and the Problem it describes.

A cost profile is a valid problem input: the top level carries every field of the problem
(as ``pp-opt.problem`` does, memory in bytes, times in ms), and ``profile`` carries where the
numbers came from: the kind (``analytic`` or ``measured``), the model and hardware cards, the
layout, per-stage details and, for measured profiles, the environment and the raw timings.
:func:`pp_opt.problem_io.problem_from_costs` reads one as a problem and keeps ``profile`` in
``Problem.extra["profile"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.problem import Device, Problem, Stage
from pp_opt.problem_io import COSTS_FORMAT as FORMAT
from pp_opt.problem_io import COSTS_VERSION as VERSION
from pp_opt.problem_io import stage_row
from pp_opt.profiler.cards import (
    HardwareCard,
    ModelCard,
    hardware_card_from_dict,
    model_card_from_dict,
)
from pp_opt.profiler.comm import copy_ms
from pp_opt.profiler.stacks import load_stack_card


@dataclass(kw_only=True, slots=True, frozen=True)
class StageCost:
    """Costs of one microbatch on one stage, in ms and bytes, before they become a Stage."""

    device: int
    layers: int
    t_f: float = 0.0
    t_b: float = 0.0
    t_w: float = 0.0
    m_b: float = 0.0
    m_w: float = 0.0
    m_in: float = 0.0
    params: float = 0.0
    """Parameters on this GPU (already divided by the tensor-parallel degree)."""
    expert_params: float = 0.0
    """The routed experts' share of ``params`` (divided by ``ep x etp``): their state is
    sharded over the expert data-parallel ranks, not the data-parallel ones."""
    t_f_comm: float = 0.0
    """The communication in ``t_f`` (all-to-all, TP and CP collectives) an overlapped pair
    can hide behind the other half's compute."""
    t_b_comm: float = 0.0
    """The communication in ``t_b``."""
    embedding: bool = False
    head: bool = False
    t_bw: float | None = None
    """Fused backward when it is not ``t_b + t_w`` (measured profiles)."""
    t_offload: float | None = None
    """Measured OFFLOAD time; None: from ``m_b`` and the copy bandwidth."""
    t_reload: float | None = None
    """Measured RELOAD time; None: from ``m_b`` and the copy bandwidth."""
    timings: dict[str, Any] | None = None
    """Measured spread per cost (median, iqr, min, max, repeats), keyed like the costs."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LinkCosts:
    """How a job's devices talk: pipeline sends and host copies."""

    t_comm: float
    """One activation sent between pipeline neighbours (ms), the slowest link in use."""
    host_links: list[list[int]]
    """Groups of devices that share one host link."""
    d2h_gbs: float
    """Device-to-host copy bandwidth per GPU (GB/s)."""
    h2d_gbs: float
    """Host-to-device copy bandwidth per GPU (GB/s)."""
    spans_nodes: bool = False
    """The pipeline crosses a node boundary."""


@dataclass(kw_only=True, slots=True, frozen=True)
class CostProfile:
    """What the profiler found for one job: per-stage costs, links and static memory.

    :func:`problem_from_profile` turns it into the Problem to solve; :meth:`to_dict` is its
    file (``"format": "pp-opt.costs"``) and :meth:`from_dict` reads one back.
    """

    job: Job
    """The job it was made for (layers split)."""
    kind: str
    """``analytic`` or ``measured``."""
    model: ModelCard
    """The model card."""
    hardware: HardwareCard
    """The hardware card."""
    stages: tuple[StageCost, ...]
    """Costs of one microbatch on each stage."""
    static: tuple[float, ...]
    """Weights, gradients and optimizer state per device (bytes)."""
    cap: float
    """Memory cap of the tightest device (bytes)."""
    links: LinkCosts
    """Pipeline sends and host copies."""
    bytes_per_param: float
    """Static bytes per parameter the ``static`` memory was counted with."""
    environment: dict[str, Any] | None = None
    """Where a measured profile ran."""
    measurements: dict[str, Any] | None = None
    """How a measured profile timed (repeats, warm-up, mode, link)."""
    caps: tuple[float, ...] = ()
    """Memory cap per device (bytes): a device's fragmentation falls on what it allocates
    beyond its static memory, so devices with more static memory reach more; empty: every
    device :attr:`cap`."""

    def device_caps(self) -> tuple[float, ...]:
        """Memory cap per device (bytes)."""
        return self.caps or tuple(self.cap for _ in self.static)

    def stage_params(self) -> list[float]:
        """Parameters per stage and GPU."""
        return [st.params for st in self.stages]

    def device_params(self, *, experts: bool = False) -> list[float]:
        """Parameters per device and GPU (its routed experts' only, with ``experts``)."""
        out = [0.0] * self.job.pp
        for st in self.stages:
            out[st.device] += st.expert_params if experts else st.params
        return out

    def name(self) -> str:
        j = self.job
        return (
            f"{self.model.name} on {self.hardware.name}: pp={j.pp} v={j.v} {j.placement} "
            f"mbs={j.mbs} seq={j.seq} tp={j.tp} ({self.kind})"
        )

    def problem_stages(self) -> tuple[Stage, ...]:
        """Each stage's problem costs (copy times from the links when not measured)."""
        return tuple(
            Stage(
                device=st.device,
                t_f=st.t_f,
                t_b=st.t_b,
                t_w=st.t_w,
                t_bw=st.t_bw,
                m_b=st.m_b,
                m_w=st.m_w,
                m_in=st.m_in,
                t_offload=offload_ms(st, self.links),
                t_reload=reload_ms(st, self.links),
                t_f_comm=st.t_f_comm if self.hides_communication else 0.0,
                t_b_comm=st.t_b_comm if self.hides_communication else 0.0,
            )  # fmt: skip
            for st in self.stages
        )

    @property
    def hides_communication(self) -> bool:
        """An overlapped pair of this job hides communication: the job overlaps and its
        stack runs a pair's halves at once (torchtitan 0.3.0 runs them in sequence)."""
        return self.job.overlap and load_stack_card(self.job.stack).overlaps_pairs

    def pair_settings(self) -> dict[str, Any]:
        """The problem's ``pairs`` and ``pair_overhead`` (absent when the job does not
        overlap, so files of other jobs stay as they were)."""
        if not self.job.overlap:
            return {}
        return {"pairs": True, "pair_overhead": load_stack_card(self.job.stack).pair_overhead}

    def stage_rows(self) -> list[dict[str, Any]]:
        """The file's ``stages``: each stage's problem costs."""
        return [stage_row(st) for st in self.problem_stages()]

    def provenance(self) -> dict[str, Any]:
        """The file's ``profile`` object (also a solved problem's ``extra["profile"]``)."""
        details = []
        for st in self.stages:
            det: dict[str, Any] = {"layers": st.layers, "embedding": st.embedding,
                                   "head": st.head, "params": st.params}  # fmt: skip
            for key in ("expert_params", "t_f_comm", "t_b_comm"):
                if getattr(st, key):
                    det[key] = getattr(st, key)
            if st.timings is not None:
                det["timings"] = st.timings
            details.append(det)
        out: dict[str, Any] = {
            "kind": self.kind, "time_unit": "ms", "model": self.model.to_dict(),
            "hardware": self.hardware.to_dict(),
            "layout": self.job.layout_dict(self.bytes_per_param),
            "d2h_gbs": self.links.d2h_gbs, "h2d_gbs": self.links.h2d_gbs, "stages": details,
            "environment": self.environment, "measurements": self.measurements,
        }  # fmt: skip
        if self.job.tp_comm and self.job.tp > 1:
            out["tp_comm"] = True
        return out

    def to_dict(self) -> dict[str, Any]:
        """The cost profile file (``"format": "pp-opt.costs"``)."""
        j = self.job
        return {
            "format": FORMAT, "version": VERSION, "name": self.name(), "p": j.pp,
            "m": j.microbatches, "placement": j.placement, "v": j.v, "unit": "bytes",
            "t_comm": self.links.t_comm, "stages": self.stage_rows(),
            "devices": [{"cap": c, "static": s}
                        for c, s in zip(self.device_caps(), self.static, strict=True)],
            "host_links": self.links.host_links, **self.pair_settings(),
            "profile": self.provenance(),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostProfile:
        """Read a cost profile file written by :meth:`to_dict` (checked as a problem first)."""
        from pp_opt.problem_io import problem_from_costs

        problem_from_costs(data)  # every problem field checked, one-line errors
        return _profile_from_dict(cls, data)


def offload_ms(stage: StageCost, links: LinkCosts) -> float:
    """A stage's OFFLOAD time: measured, else its ``m_b`` over the copy bandwidth."""
    return stage.t_offload if stage.t_offload is not None else copy_ms(stage.m_b, links.d2h_gbs)


def reload_ms(stage: StageCost, links: LinkCosts) -> float:
    """A stage's RELOAD time: measured, else its ``m_b`` over the copy bandwidth."""
    return stage.t_reload if stage.t_reload is not None else copy_ms(stage.m_b, links.h2d_gbs)


def problem_from_profile(profile: CostProfile) -> Problem:
    """The Problem ``profile`` describes (memory in bytes, times in ms), built directly; its
    provenance goes to ``extra["profile"]`` for the files a schedule is saved in."""
    if not isinstance(profile, CostProfile):
        raise ProblemError(
            "profile", f"got {type(profile).__name__}; give a CostProfile (pp_opt.profile_job)"
        )
    stages = profile.problem_stages()
    devices = tuple(
        Device(cap=c, static=s) for c, s in zip(profile.device_caps(), profile.static, strict=True)
    )
    return Problem(
        p=profile.job.pp, m=profile.job.microbatches, stages=stages, devices=devices,
        placement=profile.job.placement, unit="bytes", t_comm=profile.links.t_comm,
        host_links=tuple(tuple(g) for g in profile.links.host_links), name=profile.name(),
        extra={"profile": profile.provenance()}, **profile.pair_settings(),
    )  # fmt: skip


def _profile_from_dict(cls: type[CostProfile], data: Mapping[str, Any]) -> CostProfile:
    info = data["profile"]
    model = model_card_from_dict(info["model"], info["model"].get("name", "model"))
    hardware = hardware_card_from_dict(info["hardware"], info["hardware"].get("name", "hardware"))
    tp_one = info["layout"].get("tp", 1) == 1  # files without the key and tp > 1 left it out
    job = Job.from_layout_dict(info["layout"], tp_comm=bool(info.get("tp_comm", tp_one)))
    stages = []
    for row, det in zip(data["stages"], info["stages"], strict=True):
        stages.append(StageCost(
            device=row["device"], layers=det["layers"], t_f=row["t_f"], t_b=row["t_b"],
            t_w=row["t_w"], m_b=row["m_b"], m_w=row["m_w"], m_in=row["m_in"],
            params=det["params"], embedding=det["embedding"], head=det["head"],
            t_bw=row.get("t_bw"), t_offload=row["t_offload"], t_reload=row["t_reload"],
            timings=det.get("timings"),
        ))  # fmt: skip
    caps = tuple(float(d["cap"]) for d in data["devices"])
    links = LinkCosts(t_comm=data["t_comm"], host_links=[list(g) for g in data["host_links"]],
                      d2h_gbs=info["d2h_gbs"], h2d_gbs=info["h2d_gbs"])  # fmt: skip
    return cls(job=job, kind=info["kind"], model=model, hardware=hardware, stages=tuple(stages),
               static=tuple(d["static"] for d in data["devices"]),
               cap=min(caps), caps=caps if len(set(caps)) > 1 else (), links=links,
               bytes_per_param=float(info["layout"]["bytes_per_param"]),
               environment=info.get("environment"),
               measurements=info.get("measurements"))  # fmt: skip


def costs_table(data: Mapping[str, Any]) -> str:
    """A plain-text table of a cost profile: one row per stage (ms, GiB), then the links."""
    profile = data.get("profile", {})
    details = profile.get("stages") or [{} for _ in data["stages"]]
    spread = any("timings" in det for det in details)
    times = ("t_f", "t_b", "t_w", "t_bw")
    width = 15 if spread else 8
    head = (
        f"{'stage':>5} {'dev':>3} {'layers':>6} "
        + " ".join(f"{k:>{width}}" for k in times)
        + f" {'m_b GiB':>8} {'m_w GiB':>8} {'t_offl':>8}"
    )
    lines = [data.get("name", ""), head]
    for s, (row, det) in enumerate(zip(data["stages"], details, strict=True)):
        marks = ("E" if det.get("embedding") else "") + ("H" if det.get("head") else "")
        cells = []
        for key in times:
            value = row.get(key, row["t_b"] + row["t_w"] if key == "t_bw" else 0.0)
            iqr = det.get("timings", {}).get(key, {}).get("iqr")
            cells.append(f"{value:8.3f}" + (f" ±{iqr:5.2f}" if iqr is not None else "")
                         if spread else f"{value:8.3f}")  # fmt: skip
        lines.append(
            f"{s:>5} {row['device']:>3} {str(det.get('layers', '')) + marks:>6} "
            + " ".join(f"{c:>{width}}" for c in cells)
            + f" {row['m_b'] / 2**30:8.3f} {row['m_w'] / 2**30:8.3f} {row['t_offload']:8.3f}"
        )
    static = max(d["static"] for d in data["devices"]) / 2**30
    cap = data["devices"][0]["cap"] / 2**30
    if spread:
        meas = profile.get("measurements") or {}
        lines.append(
            f"median ± interquartile range of {meas.get('repeats', '?')} runs after "
            f"{meas.get('warmup', '?')} warm-up runs, stages timed {meas.get('mode', '?')}; "
            "t_b/t_w are PyTorch's I/W, t_bw its fused B"
        )
    lines.append(
        f"times in ms (E: embedding, H: output layer); t_comm {data['t_comm']:.3f} ms"
        f"{' (measured)' if (profile.get('measurements') or {}).get('link') else ''}; "
        f"static up to {static:.2f} GiB of a {cap:.2f} GiB cap; "
        f"{profile.get('kind', '?')} profile"
    )
    return "\n".join(lines)
