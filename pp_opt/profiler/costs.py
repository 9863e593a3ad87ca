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
from typing import Any

from pp_opt.problem_io import COSTS_FORMAT as FORMAT
from pp_opt.problem_io import COSTS_VERSION as VERSION
from pp_opt.profiler.analytic import StageCost
from pp_opt.profiler.cards import HardwareCard, ModelCard
from pp_opt.profiler.layout import Layout


def costs_dict(
    *,
    kind: str,
    card: ModelCard,
    hw: HardwareCard,
    layout: Layout,
    stages: list[StageCost],
    static: list[float],
    cap: float,
    t_comm: float,
    host_links: list[list[int]],
    d2h_gbs: float,
    h2d_gbs: float,
    environment: dict[str, Any] | None = None,
    measurements: dict[str, Any] | None = None,
    **_: Any,
) -> dict[str, Any]:
    """Assemble the cost profile JSON from stage costs.

    ``t_offload``/``t_reload`` are the measured ones where a stage has them, else ``m_b`` over
    the copy bandwidth; ``t_bw`` is written only when measured (else it is ``t_b + t_w``).
    """
    rows = []
    for st in stages:
        row = {"device": st.device, "t_f": st.t_f, "t_b": st.t_b, "t_w": st.t_w}
        if st.t_bw is not None:
            row["t_bw"] = st.t_bw
        row.update(m_b=st.m_b, m_w=st.m_w, m_in=st.m_in)
        row["t_offload"] = (
            st.t_offload if st.t_offload is not None else 1e3 * st.m_b / (d2h_gbs * 1e9)
        )
        row["t_reload"] = st.t_reload if st.t_reload is not None else 1e3 * st.m_b / (h2d_gbs * 1e9)
        rows.append(row)
    details = []
    for st in stages:
        det: dict[str, Any] = {
            "layers": st.layers,
            "embedding": st.embedding,
            "head": st.head,
            "params": st.params,
        }
        if st.timings is not None:
            det["timings"] = st.timings
        details.append(det)
    name = (
        f"{card.name} on {hw.name}: pp={layout.pp} v={layout.v} {layout.placement} "
        f"mbs={layout.mbs} seq={layout.seq} tp={layout.tp} ({kind})"
    )
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "p": layout.pp,
        "m": layout.microbatches,
        "placement": layout.placement,
        "v": layout.v,
        "unit": "bytes",
        "t_comm": t_comm,
        "stages": rows,
        "devices": [{"cap": cap, "static": s} for s in static],
        "host_links": host_links,
        "profile": {
            "kind": kind,
            "time_unit": "ms",
            "model": card.to_dict(),
            "hardware": hw.to_dict(),
            "layout": layout.to_dict(),
            "d2h_gbs": d2h_gbs,
            "h2d_gbs": h2d_gbs,
            "stages": details,
            "environment": environment,
            "measurements": measurements,
        },
    }


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
