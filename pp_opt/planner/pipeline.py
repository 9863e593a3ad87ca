"""``plan``: the planner as a short sequence of named steps.

enumerate legal configurations -> screen a large search -> split their layers -> bound and
prune -> solve the simple points, then the survivors (short limits) -> evaluate the defaults
beside the best -> refine the top few (the time left) -> rank and emit. Each step is a
function of its own module.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pp_opt.arguments import MAX_SEED, callback, integer, number, optional
from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.planner.baselines import baseline_candidates
from pp_opt.planner.candidates import split_layers
from pp_opt.planner.config import Candidate, Pins, PlanInputs
from pp_opt.planner.evaluate import SOLVED, EvaluationTask, Scored
from pp_opt.planner.executors import Executor, make_executor
from pp_opt.planner.problems import Bounded, bound_candidate
from pp_opt.planner.result import Plan
from pp_opt.planner.screen import screen
from pp_opt.planner.search import (
    NOT_PREPARED,
    ProgressFn,
    SearchResult,
    refine,
    solve_survivors,
)
from pp_opt.planner.simple import SIMPLE_SHARE, simple_points
from pp_opt.planner.space import Enumeration, enumerate_configs
from pp_opt.profiler.cards import HardwareCard, ModelCard, load_hardware_card, load_model_card
from pp_opt.solvers.process.stop import StopToken

log = logging.getLogger(__name__)

SCREEN_SHARE = 0.6
"""Share of the time limit after which no further candidate is screened."""
SHORT_LIMIT = (1.0, 10.0)
"""Least and most seconds of one screening solve."""
FINISH_MARGIN = 0.03
"""Share of the time limit kept free at the end (writing the plan)."""


def short_limit(time_limit: float, candidates: int, workers: int) -> float:
    """Seconds per screening solve: the screening share of the time, over the candidates,
    times the workers, within :data:`SHORT_LIMIT`."""
    low, high = SHORT_LIMIT
    if candidates == 0:
        return low
    share = SCREEN_SHARE * time_limit * workers / candidates
    return max(low, min(high, share, SCREEN_SHARE * time_limit))


ANCHOR_JOBS = 6
"""Solves of one anchor's defaults: torchtitan's two schedules and Megatron-LM's, each with
its own order and with pp_opt's (:func:`pp_opt.planner.baselines.baseline_candidates`)."""
BASELINE_JOBS = ANCHOR_JOBS + 2
"""Solves of all defaults: a best without a pipeline adds its own one-stage default (two
solves) before the best pipelined candidate's (:func:`default_anchors`)."""
BASELINE_ROUNDS = 1.2
"""Evaluations the defaults are kept per round of jobs over the workers (a solve overruns
its limit by a little)."""


def baseline_seconds(scored: Sequence[Scored], short: float, jobs: int, workers: int) -> float:
    """Seconds kept for ``jobs`` evaluations of defaults: a screening limit each, or what the
    search's evaluations took (median) where that is longer (a large model's profile, bound
    and scoring add to its solve)."""
    took = sorted(s.seconds for s in scored)
    each = max(short, took[len(took) // 2]) if took else short
    return BASELINE_ROUNDS * each * -(-jobs // workers)


NO_SPLIT = "infeasible: no layer split fits the memory"
PREPARE_SHARE = 0.2
"""Share of the time limit after which no further configuration is split or bounded (a
405B model's split and bound take about a second per configuration on a loaded machine)."""


def prepare(
    inputs: PlanInputs, pins: Pins, *, splits: int = 2, deadline: float | None = None
) -> tuple[Enumeration, list[Bounded], Counter[str], list[Candidate]]:
    """Steps 1 to 3: the legal configurations, their split candidates with bounds, and the
    infeasible ones counted by reason (a configuration without a split counts once).

    Configurations are split in the screen's order (a large search's: best estimate first),
    and the candidates without recompute and offload bounded before those with them; past
    ``deadline`` (:func:`time.perf_counter`) the rest are counted under
    :data:`NOT_PREPARED` (configurations not split, candidates not bounded) and returned
    last, in order, for a search with time left."""
    enumeration = enumerate_configs(inputs, pins)
    if not enumeration.configs:
        reasons = ", ".join(sorted(enumeration.skipped)) or "nothing to try"
        raise ProblemError("gpus", f"no legal configuration ({reasons}); change the pins")
    configs, screened = screen(inputs, enumeration.configs)
    pruned: Counter[str] = Counter(screened)
    bounded, waiting = prepare_configs(inputs, configs, pruned, splits=splits, deadline=deadline)
    return enumeration, bounded, pruned, waiting


def prepare_configs(
    inputs: PlanInputs, configs: Sequence[Candidate], pruned: Counter[str], *, splits: int,
    deadline: float | None,
) -> tuple[list[Bounded], list[Candidate]]:  # fmt: skip
    """Split and bound ``configs`` in order until ``deadline`` (counted into ``pruned``; a
    config whose layers are split already is only bounded); the bounded candidates, and what
    was not reached (configurations not split, candidates not bounded)."""

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    cache: dict[Job, list[tuple[int, ...]]] = {}
    bounded: list[Bounded] = []
    variants: list[Candidate] = []  # with recompute or offload: bounded after the others
    waiting: list[Candidate] = []
    for n, config in enumerate(configs):
        if late():
            pruned[NOT_PREPARED] += len(configs) - n
            waiting = list(configs[n:])
            break
        if config.job.layers:  # a split candidate left unbounded by an earlier preparation
            variants.append(config)
            continue
        candidates, unsplit = split_layers(inputs, [config], count=splits, cache=cache)
        if unsplit:
            pruned[NO_SPLIT] += unsplit
        for c in candidates:
            if c.recompute or c.offload:
                variants.append(c)
            else:
                bounded.append(bound_candidate(inputs, c))
    for n, c in enumerate(variants):
        if late():
            pruned[NOT_PREPARED] += len(variants) - n
            waiting += variants[n:]
            break
        bounded.append(bound_candidate(inputs, c))
    for b in bounded:
        if b.infeasible is not None:
            pruned[f"infeasible: {b.infeasible}"] += 1
    return bounded, waiting


def plan(
    *, model: str | Path | ModelCard, hardware: str | Path | HardwareCard, gpus: int,
    global_batch: int, seq: int | None = None, pins: Pins | None = None,
    time_limit: float = 300.0, workers: int = 1, ray: str | None = None,
    executor: Executor | None = None, keep: int = 5, splits: int = 2, refine_top: int = 3,
    seed: int = 0, threads: int = 1, progress: ProgressFn | None = None,
    stop: StopToken | None = None,
) -> Plan:  # fmt: skip
    """Rank the configurations of one training job by step time.

    Parameters
    ----------
    model, hardware
        Card paths, bundled card names or loaded cards.
    gpus, global_batch, seq
        GPUs, sequences per optimizer step, sequence length (the model card's by default).
    pins
        Dimensions to pin (each a set of values); the others are searched.
    time_limit
        Wall-clock seconds for the whole plan.
    workers, ray, executor
        Where candidates are solved: ``workers`` local processes (one: this process), a Ray
        cluster (``ray="auto"`` or an address), or an :class:`Executor` of your own.
    keep
        Candidates whose bound cannot beat the ``keep``-th best step time are pruned, so the
        first ``keep`` of the ranking are what an exhaustive search would give.
    splits
        Layer splits tried per configuration.
    refine_top
        Best candidates solved again with the time left.
    seed, threads
        Solver seed and threads per solve (the same seed and threads, and solves that end
        before their limits, give the same plan on every executor).
    progress
        Called as candidates finish.
    stop
        A :class:`~pp_opt.solvers.process.stop.StopToken`: ``stop.request(reason)`` (from any
        thread, or a signal handler) stops submitting candidates and keeps those solved.

    Returns
    -------
    Plan
        Ranked candidates, the defaults beside the best, pruned and skipped counts.
    """
    started = time.perf_counter()
    _check_arguments(time_limit=time_limit, keep=keep, splits=splits, refine_top=refine_top,
                     workers=workers, threads=threads, seed=seed, pins=pins, ray=ray,
                     executor=executor, progress=progress, stop=stop)  # fmt: skip
    stop = stop if stop is not None else StopToken()
    card = load_model_card(model)
    inputs = PlanInputs(
        model=card, hardware=load_hardware_card(hardware), gpus=gpus,
        global_batch=global_batch, seq=card.seq if seq is None else seq,
    )  # fmt: skip
    pins = pins or Pins()

    owned = executor is None  # made first: a Ray address that does not answer fails early
    runner = (
        executor if executor is not None else make_executor(workers=workers, ray=ray, stop=stop)
    )
    try:
        ready = started + PREPARE_SHARE * time_limit
        enumeration, bounded, pruned, waiting = prepare(inputs, pins, splits=splits, deadline=ready)
        found, defaults = _search(
            inputs, pins, bounded, pruned, runner, configs=enumeration.configs,
            waiting=waiting, splits=splits, started=started, time_limit=time_limit, keep=keep,
            seed=seed, threads=threads, refine_top=refine_top, progress=progress, stop=stop,
        )  # fmt: skip
    finally:
        if owned:
            runner.close()
    result = Plan(
        inputs=inputs, pins=pins, candidates=sorted((s for s in found.scored if s.ok),
                                                    key=Scored.sort_key),
        failed=[s for s in found.scored if not s.ok], baselines=defaults, pruned=found.pruned,
        skipped=enumeration.skipped, configurations=len(enumeration.configs),
        seconds=time.perf_counter() - started, time_limit=time_limit,
        executor=type(runner).__name__ if not owned else _executor_name(workers, ray),
    )  # fmt: skip
    return _with_training(result)


def _search(
    inputs: PlanInputs, pins: Pins, bounded: list[Bounded], pruned: Counter[str],
    runner: Executor, *, configs: Sequence[Candidate], waiting: Sequence[Candidate],
    splits: int, started: float, time_limit: float, keep: int, seed: int, threads: int,
    refine_top: int, progress: ProgressFn | None, stop: StopToken,
) -> tuple[SearchResult, list[Scored]]:  # fmt: skip
    """Steps 4 and 5: the simple points first (:mod:`pp_opt.planner.simple`), then the
    survivors best-bound first, refine the best with the time left but what the defaults
    need, then run the defaults beside the best after refinement (the plan's answer: a
    candidate screened first may lose its place, and the defaults compare with the best's
    degrees; :func:`default_anchors`)."""
    end = started + time_limit * (1 - FINISH_MARGIN)
    feasible = sum(b.infeasible is None for b in bounded)
    short = short_limit(time_limit, feasible, runner.workers)
    most = int(SIMPLE_SHARE * SCREEN_SHARE * time_limit * runner.workers / short)
    simple = simple_points(inputs, configs, bounded, most=most)
    found = solve_survivors(
        inputs, bounded, runner, short=short, deadline=started + SCREEN_SHARE * time_limit,
        keep=keep, seed=seed, threads=threads, started=started,
        total=len(bounded) + pruned[NO_SPLIT], pruned=pruned, progress=progress, stop=stop,
        first=simple,
    )  # fmt: skip
    reserve = baseline_seconds(found.scored, short, BASELINE_JOBS, runner.workers)
    log.debug("search done at %.1f s (defaults reserve %.1f s from %.1f s)",
              time.perf_counter() - started, reserve, end - reserve - started)  # fmt: skip
    refine(inputs, found, runner, count=refine_top, deadline=end - reserve, seed=seed,
           threads=threads, stop=stop)  # fmt: skip
    log.debug("refinement done at %.1f s", time.perf_counter() - started)
    if (
        waiting
        and stop.requested is None
        and end - reserve - time.perf_counter() > MORE_LEAST * short
    ):
        _solve_waiting(inputs, waiting, found, runner, splits=splits, short=short,
                       deadline=end - reserve, keep=keep, seed=seed, threads=threads,
                       stop=stop)  # fmt: skip
    log.debug("defaults start at %.1f s", time.perf_counter() - started)
    ranked = sorted((s for s in found.scored if s.ok), key=Scored.sort_key)
    defaults: list[Scored] = []
    anchor_seconds = baseline_seconds(found.scored, short, ANCHOR_JOBS, runner.workers)
    for anchor in default_anchors(ranked):
        if stop.requested is not None or (
            defaults and time.perf_counter() + anchor_seconds > end
        ):  # fmt: skip
            break
        defaults += _baselines(inputs, pins, anchor, runner, short=short, seed=seed,
                               threads=threads, deadline=end)  # fmt: skip
    return found, defaults


MORE_LEAST = 4.0
"""Screening limits of time left after refinement below which the configurations that
preparation did not reach stay unsolved."""


def _solve_waiting(
    inputs: PlanInputs, waiting: Sequence[Candidate], found: SearchResult, runner: Executor, *,
    splits: int, short: float, deadline: float, keep: int, seed: int, threads: int,
    stop: StopToken,
) -> None:  # fmt: skip
    """With time left after the search and its refinement, the configurations preparation
    did not reach: split and bound them in order (half the time), and solve their survivors
    against everything found so far, into ``found``."""
    now = time.perf_counter()
    pruned: Counter[str] = Counter()
    bounded, left = prepare_configs(inputs, waiting, pruned, splits=splits,
                                    deadline=now + (deadline - now) / 2)  # fmt: skip
    pruned[NOT_PREPARED] -= len(waiting)  # counted once already, by the first preparation
    more = solve_survivors(inputs, bounded, runner, short=short, deadline=deadline, keep=keep,
                           seed=seed, threads=threads, pruned=pruned, stop=stop,
                           known=found.scored)  # fmt: skip
    found.scored += more.scored
    found.pruned = +(
        found.pruned + more.pruned
    )  # the configurations now prepared leave NOT_PREPARED
    log.debug("%d configurations prepared late, %d still waiting", len(waiting) - len(left),
              len(left))  # fmt: skip


def default_anchors(ranked: Sequence[Scored]) -> list[Scored]:
    """Whose degrees the defaults take: the best's; when it has no pipeline, also the best
    pipelined candidate's, so that the frameworks' pipeline schedules (1F1B, Interleaved1F1B)
    are compared too (time allowing)."""
    if not ranked:
        return []
    piped = next((s for s in ranked if s.candidate.job.pp > 1), None)
    return [ranked[0]] + ([piped] if ranked[0].candidate.job.pp == 1 and piped else [])


def _with_training(result: Plan) -> Plan:
    """The plan with the training settings of its best runnable candidate."""
    from pp_opt.planner.training import plan_training

    try:  # torchtitan 0.3, the best candidate's own activation checkpointing
        result.training = plan_training(result).settings
    except ProblemError as err:  # the ranking stands without them
        result.training = {"notes": [f"no training settings: {err}"]}
    return result


def _check_arguments(
    *, time_limit: object, keep: object, splits: object, refine_top: object, workers: object,
    threads: object, seed: object, pins: object, ray: object, executor: object,
    progress: object, stop: object,
) -> None:  # fmt: skip
    """Each of :func:`plan`'s arguments checked by name, before any work starts."""
    number("time_limit", time_limit, low=1.0, high=1e7)
    integer("keep", keep, low=1, high=10_000)
    integer("splits", splits, low=1, high=3)
    integer("refine_top", refine_top, low=0, high=100)
    integer("workers", workers, low=1, high=1024)
    integer("threads", threads, low=1, high=1024)
    integer("seed", seed, low=0, high=MAX_SEED)
    optional("pins", pins, Pins, "a Pins")
    optional("ray", ray, str, "'auto' or a Ray address")
    optional("executor", executor, Executor, "an Executor")
    callback("progress", progress)
    optional("stop", stop, StopToken, "a StopToken")


def _executor_name(workers: int, ray: str | None) -> str:
    if ray is not None:
        return f"ray ({ray})"
    return "this process" if workers == 1 else f"{workers} local processes"


def _baselines(
    inputs: PlanInputs,
    pins: Pins,
    best: Scored,
    executor: Executor,
    *,
    short: float,
    seed: int,
    threads: int,
    deadline: float,
) -> list[Scored]:
    """torchtitan's and Megatron-LM's defaults for the best's degrees, each with its own
    order and with pp_opt's solved one."""
    jobs = []
    limit = max(1.0, min(short, (deadline - time.perf_counter()) / 4))
    for label, name, candidate in baseline_candidates(
        best.candidate, inputs.model.layers, model=inputs.model.name, pins=pins
    ):
        for order in (name, SOLVED):
            jobs.append(EvaluationTask(inputs=inputs, candidate=candidate, order=order,
                                       time_limit=limit, seed=seed, threads=threads,
                                       label=label))  # fmt: skip
    for job in jobs:
        executor.submit(job)
    done = [executor.next_done() for _ in jobs]
    place = {(j.label, j.candidate, j.order): i for i, j in enumerate(jobs)}
    return sorted(done, key=lambda s: place[(s.label, s.candidate, s.order)])
