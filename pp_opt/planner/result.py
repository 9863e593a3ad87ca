"""Step 6 of a plan: the ranked result and its JSON (``"format": "pp-opt.plan"``)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pp_opt.planner.config import Pins, PlanInputs
from pp_opt.planner.evaluate import Scored
from pp_opt.schedule import Schedule

FORMAT = "pp-opt.plan"
VERSION = 1


@dataclass(kw_only=True, slots=True)
class Plan:
    """Ranked candidates of one training job, the defaults beside them, and the counts."""

    inputs: PlanInputs
    """The training job."""
    pins: Pins
    """The dimensions the user pinned."""
    candidates: list[Scored]
    """Evaluated candidates with a schedule, best step time first."""
    failed: list[Scored] = field(default_factory=list)
    """Evaluated candidates without one (infeasible for every order tried, or timed out)."""
    baselines: list[Scored] = field(default_factory=list)
    """torchtitan's and Megatron-LM's defaults on the same costs, each with its own order and
    with pp_opt's."""
    pruned: Counter[str] = field(default_factory=Counter)
    """Candidates not solved, by reason (infeasible ones included)."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Configurations that do not divide, by reason."""
    configurations: int = 0
    """Legal configurations enumerated."""
    seconds: float = 0.0
    """Wall-clock seconds of the plan."""
    time_limit: float = 0.0
    """Its time limit."""
    executor: str = ""
    """Where the candidates ran."""
    training: dict[str, Any] = field(default_factory=dict)
    """Training-job settings of the best candidate (torchtitan keys, Megatron-LM flags)."""

    @property
    def unsolved(self) -> int:
        """Candidates the time limit (or an interruption) left unsolved (configurations it
        left unsplit count once each)."""
        from pp_opt.planner.search import NOT_PREPARED, NOT_SOLVED_INTERRUPTED, PRUNED_BY_TIME

        return sum(self.pruned[k] for k in (NOT_PREPARED, PRUNED_BY_TIME, NOT_SOLVED_INTERRUPTED))

    @property
    def best(self) -> Scored | None:
        return self.candidates[0] if self.candidates else None

    def best_schedule(self) -> Schedule | None:
        """The best candidate's validated schedule."""
        from pp_opt.schedule_io import schedule_from_dict

        best = self.best
        if best is None or best.schedule is None:
            return None
        return schedule_from_dict(best.schedule)

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        evaluated = len(self.candidates) + len(self.failed)
        return {
            "format": FORMAT,
            "version": VERSION,
            "inputs": {
                **self.inputs.to_dict(),
                "pins": self.pins.to_dict(),
                "time_limit": self.time_limit,
                "executor": self.executor,
            },  # fmt: skip
            "counts": {
                "configurations": self.configurations,
                "candidates": evaluated + sum(self.pruned.values()),
                "evaluated": evaluated,
                "pruned": sum(self.pruned.values()),
                "unsolved": self.unsolved,
                "skipped": sum(self.skipped.values()),
            },
            "seconds": self.seconds,
            "candidates": [s.to_dict() for s in self.candidates],
            "failed": [s.to_dict() for s in self.failed],
            "schedule": None if best is None else best.schedule,
            "baselines": [s.to_dict() for s in self.baselines],
            "pruned": dict(sorted(self.pruned.items())),
            "skipped": dict(sorted(self.skipped.items())),
            "training": self.training,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def save(self, path: str | Path) -> Path:
        from pp_opt.atomic import write_text

        return write_text(path, self.dumps())
