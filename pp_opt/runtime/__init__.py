"""Run pp_opt schedules with PyTorch's pipeline runtime, offload included (docs/design.md §6).

Needs PyTorch (the ``torch`` extra); the rest of pp_opt does not import it.

Example, on every rank of ``torchrun --nproc-per-node P``::

    schedule = load_schedule("schedule.json")
    stages = [PipelineStage(chunk, s, schedule.problem.num_stages, device)
              for s, chunk in my_chunks]
    pipe = build_pipeline_schedule(schedule, stages, loss_fn=loss_fn)
    pipe.step(x, target=y, losses=losses)   # inputs on the first stage's rank
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pp_opt.runtime needs PyTorch; install it (pip install 'pp-opt[torch]')"
    ) from err

from pp_opt.runtime.offload import ActivationOffloader, OffloadEvent, SavedActivation
from pp_opt.runtime.torch_schedule import (
    OffloadActionType,
    PPOptPipelineSchedule,
    build_pipeline_schedule,
    check_stages,
)

__all__ = [
    "ActivationOffloader",
    "OffloadActionType",
    "OffloadEvent",
    "PPOptPipelineSchedule",
    "SavedActivation",
    "build_pipeline_schedule",
    "check_stages",
]
