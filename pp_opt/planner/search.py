"""Steps 4 and 5 of a plan: prune by bound, solve the survivors best-first, refine the top.

Candidates without recompute or offload come first, then those that allow them; each tier in
order of the step-time lower bound (ties in the candidates' fixed order). Before one is
submitted, its bound is compared with the ``keep``-th best step time found so far: when it
is above it, it is pruned (a tie is solved, so the first ``keep`` do not depend on the order
in which results come back). A candidate that allows recompute or offload is also pruned
when the same candidate without them was solved with room for one more activation on every
device (its memory is not binding, so what recompute and offload trade for memory buys
nothing there). In the same way a candidate with activation checkpointing is pruned when
its configuration without checkpointing (any layer split) was solved with that room: what
checkpointing trades for memory buys nothing there either. Each survivor is solved with a
short limit; afterwards the best few are solved again, from their schedules, with the time
left.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.evaluate import EvaluationTask, Scored
from pp_opt.planner.executors import Executor
from pp_opt.planner.problems import Bounded
from pp_opt.solvers.process.stop import StopToken

log = logging.getLogger(__name__)

PRUNED_BY_BOUND = "lower bound above the best found"
PRUNED_BY_TIME = "time limit reached before it was solved"
PRUNED_BY_MEMORY = "memory not binding without recompute or offload"
PRUNED_BY_CHECKPOINTING = "memory not binding without activation checkpointing"
NOT_SOLVED_INTERRUPTED = "interrupted before it was solved"
NOT_PREPARED = "time limit reached before it was split or bounded"


@dataclass(frozen=True, slots=True)
class PlanProgress:
    """One progress report of a plan."""

    seconds: float
    """Since the plan started."""
    done: int
    """Candidates evaluated."""
    pruned: int
    """Candidates pruned or infeasible."""
    total: int
    """Candidates in all."""
    incumbent: float | None
    """Best step time so far (ms)."""
    label: str = ""
    """The best candidate's configuration."""


ProgressFn = Callable[[PlanProgress], None]


@dataclass(kw_only=True, slots=True)
class SearchResult:
    """What the search evaluated and what it pruned."""

    scored: list[Scored] = field(default_factory=list)
    """Every evaluated candidate (the refined ones replaced by their better result)."""
    pruned: Counter[str] = field(default_factory=Counter)
    """Reason -> candidates."""


def _order(b: Bounded) -> tuple[object, ...]:
    c = b.candidate
    return (c.recompute or c.offload, round(b.step_bound, 6), c.key())


def _solved_as(candidate: Candidate) -> Candidate:
    """The candidate as its problem goes (its origin aside)."""
    return replace(candidate, origin="split")


def _plain(candidate: Candidate) -> Candidate:
    """The same candidate without recompute and offload."""
    return replace(candidate, recompute=False, offload=False)


def _unchecked(candidate: Candidate) -> Candidate:
    """The candidate's configuration without checkpointing, switches or layer split."""
    job = replace(candidate.job, ac="none", full_layers=(), layers=())
    return replace(candidate, job=job, recompute=False, offload=False, origin="split")


def _kth_best(scored: Sequence[Scored], keep: int) -> float:
    values = sorted(s.step_time for s in scored if s.step_time is not None)
    return values[keep - 1] if len(values) >= keep else float("inf")


def _best(scored: Sequence[Scored]) -> Scored | None:
    ok = [s for s in scored if s.ok]
    return min(ok, key=Scored.sort_key) if ok else None


def solve_survivors(
    inputs: PlanInputs,
    bounded: Sequence[Bounded],
    executor: Executor,
    *,
    short: float,
    deadline: float,
    keep: int = 5,
    seed: int = 0,
    threads: int = 1,
    started: float | None = None,
    total: int | None = None,
    pruned: Counter[str] | None = None,
    progress: ProgressFn | None = None,
    stop: StopToken | None = None,
    first: Sequence[Bounded] = (),
    known: Sequence[Scored] = (),
) -> SearchResult:
    """Solve the feasible ``first`` candidates (the simple points), then the feasible
    ``bounded`` ones, each best-bound first, pruning by ``keep`` (among these and the
    ``known`` results of an earlier search); a candidate of ``bounded`` that is one of
    ``first`` is solved once, with them."""
    started = time.perf_counter() if started is None else started
    out = SearchResult(pruned=Counter(pruned or {}))
    ahead = sorted((b for b in first if b.infeasible is None), key=_order)
    points = {_solved_as(b.candidate) for b in ahead}
    rest = [b for b in bounded if b.infeasible is None and _solved_as(b.candidate) not in points]
    queue = ahead + sorted(rest, key=_order)
    twice = sum(b.infeasible is None for b in bounded) - len(rest)  # simple points already
    total = (len(bounded) if total is None else total) + len(ahead) - twice

    def report() -> None:
        if progress is not None:
            best = _best(out.scored)
            progress(PlanProgress(
                seconds=time.perf_counter() - started, done=len(out.scored),
                pruned=sum(out.pruned.values()), total=total,
                incumbent=None if best is None else best.step_time,
                label="" if best is None else best.candidate.label(),
            ))  # fmt: skip

    plain: dict[Candidate, Scored] = {}
    roomy: set[Candidate] = set()  # configurations solved without checkpointing, with room
    i = 0
    while i < len(queue) or executor.pending():
        while i < len(queue) and executor.pending() < executor.workers:
            if stop is not None and stop.requested is not None:
                out.pruned[NOT_SOLVED_INTERRUPTED] += len(queue) - i
                i = len(queue)
                break
            item = queue[i]
            i += 1
            if item.step_bound > _kth_best([*known, *out.scored], keep) + 1e-9:
                out.pruned[PRUNED_BY_BOUND] += 1
                continue
            twin = plain.get(_solved_as(_plain(item.candidate)))
            if twin is not None and twin.ok and not twin.memory_bound:
                out.pruned[PRUNED_BY_MEMORY] += 1
                continue
            if item.candidate.job.ac != "none" and _unchecked(item.candidate) in roomy:
                out.pruned[PRUNED_BY_CHECKPOINTING] += 1
                continue
            limit = min(short, deadline - time.perf_counter())
            if limit < min(1.0, short):
                out.pruned[PRUNED_BY_TIME] += len(queue) - i + 1
                i = len(queue)
                break
            task = EvaluationTask(inputs=inputs, candidate=item.candidate, time_limit=limit,
                                  seed=seed, threads=threads)  # fmt: skip
            executor.submit(task)
        if executor.pending():
            result = executor.next_done()
            out.scored.append(result)
            plain[_solved_as(result.candidate)] = result
            if result.ok and not result.memory_bound and result.job.ac == "none":
                roomy.add(_unchecked(result.candidate))
            log.debug("%s: %s %s", result.candidate.label(), result.status,
                      result.step_time)  # fmt: skip
            report()
    return out


REFINE_FIRST_LIMIT = 10.0
"""Seconds of each solve in the first round of refinement."""
REFINE_FIRST_SHARE = 0.5
"""Most of the refinement time its first round takes."""
REFINE_FIRST_COUNT = 6
"""The first round solves up to this many times ``count`` candidates."""


def refine(
    inputs: PlanInputs,
    result: SearchResult,
    executor: Executor,
    *,
    count: int,
    deadline: float,
    seed: int = 0,
    threads: int = 1,
    stop: StopToken | None = None,
) -> None:
    """Solve the ``count`` best (not proved optimal) again from their schedules with the time
    left, shared by the executor's workers; keep whichever result is better.

    When the time allows, a first round gives :data:`REFINE_FIRST_LIMIT` seconds to each of
    the best :data:`REFINE_FIRST_COUNT` x ``count`` (at most :data:`REFINE_FIRST_SHARE` of the
    time): a screening solve of a few seconds may leave a large problem far from what ten
    seconds reach (Llama 3.1 405B on 512 GPUs, tp8 pp16 v4: 187 tok/s/GPU after 2.5 s at a
    19.6% gap, 228 after 10 s more at 1.3%; it ranked 13th after screening, and a 600-s plan
    that refined only its 3 best ended at 209)."""
    if count < 1 or (stop is not None and stop.requested is not None):
        return
    wide = _refinable(result, REFINE_FIRST_COUNT * count)
    budget = REFINE_FIRST_SHARE * (deadline - time.perf_counter()) * executor.workers
    first = wide[: int(budget // REFINE_FIRST_LIMIT)]
    if len(first) > count:
        _solve_again(inputs, result, executor, first, limit=REFINE_FIRST_LIMIT, seed=seed,
                     threads=threads)  # fmt: skip
        if stop is not None and stop.requested is not None:
            return
    chosen = _refinable(result, count)
    if not chosen:
        return
    limit = (deadline - time.perf_counter()) / -(-len(chosen) // executor.workers)
    if limit >= 2.0:
        _solve_again(inputs, result, executor, chosen, limit=limit, seed=seed, threads=threads)


def _refinable(result: SearchResult, count: int) -> list[Scored]:
    """The ``count`` best solved candidates, variants with the very same schedule once, less
    those proved optimal."""
    ranked = sorted((s for s in result.scored if s.ok), key=Scored.sort_key)
    chosen: list[Scored] = []
    seen: set[tuple[Candidate, float | None]] = set()
    for s in ranked:
        twin = (_plain(s.candidate), s.iteration_makespan)
        if twin not in seen:
            seen.add(twin)
            chosen.append(s)
        if len(chosen) == count:
            break
    return [s for s in chosen if s.status != "optimal"]


def _solve_again(
    inputs: PlanInputs, result: SearchResult, executor: Executor, chosen: list[Scored], *,
    limit: float, seed: int, threads: int,
) -> None:  # fmt: skip
    """Each of ``chosen`` solved from its schedule for ``limit`` seconds; the better kept."""
    for s in chosen:
        task = EvaluationTask(inputs=inputs, candidate=s.candidate, time_limit=limit, seed=seed,
                              threads=threads, warm_start=s.schedule)  # fmt: skip
        executor.submit(task)
    for _ in chosen:
        again = executor.next_done()
        index = next(i for i, s in enumerate(result.scored) if s.candidate == again.candidate)
        old = result.scored[index]
        if again.ok and again.sort_key() <= old.sort_key():
            result.scored[index] = again
