"""Settings a training job can paste for the best candidate: torchtitan's ``[parallelism]``
keys and Megatron-LM's flags (:mod:`pp_opt.export.training_config`), next to the torch-csv
of its schedule."""

from __future__ import annotations

import logging
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.export.training_config import megatron_flags, torchtitan_config
from pp_opt.planner.evaluate import Scored

log = logging.getLogger(__name__)


DEFAULT_CSV = "schedule.csv"
"""The CSV the settings name when the plan wrote none (``--torch-csv`` not given)."""


def training_settings(
    best: Scored, *, n_layers: int, global_batch: int, schedule_csv: str | None = None
) -> dict[str, Any]:
    """torchtitan keys and Megatron-LM flags of ``best`` (a note instead of the flags where
    Megatron-LM cannot express the configuration, e.g. the V placement)."""
    c = best.candidate.job
    layers = list(best.candidate.layers)
    if schedule_csv is None:  # the keys still name the CSV a job needs; say how to make it
        schedule_csv = DEFAULT_CSV
        note = (
            f"write {DEFAULT_CSV} with: pp-opt export best.json --format torch-csv -o {DEFAULT_CSV}"
        )
    else:
        note = ""
    out: dict[str, Any] = {"layers": layers, "schedule_csv": schedule_csv}
    if note:
        out["schedule_csv_note"] = note
    out["torchtitan"] = torchtitan_config(
        pp=c.pp, v=c.v, placement=c.placement, mbs=c.mbs, layers=layers, n_layers=n_layers,
        schedule_csv=schedule_csv, schedule_name=None,
    )  # fmt: skip
    try:
        out["megatron"] = megatron_flags(
            tp=c.tp, pp=c.pp, v=c.v, placement=c.placement, mbs=c.mbs, layers=layers,
            n_layers=n_layers, global_batch=global_batch, recompute=best.candidate.recompute,
        )  # fmt: skip
    except ProblemError as err:  # Megatron-LM has no V placement
        out["megatron_note"] = str(err)
    return out
