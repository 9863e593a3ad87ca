"""An in-process executor for plan tests: each submitted candidate is scored at once by a
rule of the test's, with no solve."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pp_opt.planner.evaluate import EvaluationTask, Scored


class ScoringExecutor:
    """Scores each job with ``score`` (a :class:`Scored`'s step time and memory bound) and
    records what ``record`` takes of it, in submission order."""

    def __init__(self, score: Callable[[EvaluationTask], tuple[float, bool]],
                 record: Callable[[EvaluationTask], Any]) -> None:  # fmt: skip
        self.workers, self.done, self.submitted = 1, [], []
        self.score, self.record = score, record

    def submit(self, job: EvaluationTask) -> None:
        step, bound = self.score(job)
        self.submitted.append(self.record(job))
        self.done.append(Scored(candidate=job.candidate, order=job.order, status="optimal",
                                step_time=step, memory_bound=bound))  # fmt: skip

    def next_done(self) -> Scored:
        return self.done.pop(0)

    def pending(self) -> int:
        return len(self.done)

    def close(self) -> None:
        pass
