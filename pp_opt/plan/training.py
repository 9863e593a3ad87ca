"""Settings a training job can paste for the best candidate: torchtitan's ``[parallelism]``
keys and Megatron-LM's flags (:mod:`pp_opt.export.training_config`), next to the torch-csv
of its schedule."""

from __future__ import annotations

import logging
from typing import Any

from pp_opt.plan.evaluate import Scored

log = logging.getLogger(__name__)

MISSING = (
    "torchtitan and Megatron-LM settings need pp_opt.export.training_config, which this "
    "pp_opt does not have; the layers per stage and the torch-csv above are what they take"
)


def training_settings(
    best: Scored, *, n_layers: int, global_batch: int, schedule_csv: str | None = None
) -> dict[str, Any]:
    """torchtitan keys and Megatron-LM flags of ``best`` (a note instead when the exporters
    are missing)."""
    c = best.candidate.config
    layers = list(best.candidate.layers)
    out: dict[str, Any] = {"layers": layers, "schedule_csv": schedule_csv}
    try:
        from pp_opt.export.training_config import (  # type: ignore[import-not-found,unused-ignore]
            megatron_flags,
            torchtitan_config,
        )
    except ImportError:
        out["note"] = MISSING
        return out
    out["torchtitan"] = torchtitan_config(
        pp=c.pp, v=c.v, placement=c.placement, mbs=c.mbs, layers=layers, n_layers=n_layers,
        schedule_csv=schedule_csv, schedule_name=None,
    )  # fmt: skip
    out["megatron"] = megatron_flags(
        tp=c.tp, pp=c.pp, v=c.v, placement=c.placement, mbs=c.mbs, layers=layers,
        n_layers=n_layers, global_batch=global_batch, recompute=c.recompute,
    )  # fmt: skip
    return out
