"""Running a built model with CBC or HiGHS through PuLP, and reading status and bound back."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field

import pulp

from pp_opt.errors import ProblemError
from pp_opt.solvers.base import Progress, SolveOptions
from pp_opt.solvers.process.stop import Search

log = logging.getLogger(__name__)

BACKENDS = ("cbc", "highs")


@dataclass(kw_only=True, slots=True)
class RunOutcome:
    """What a MILP backend said: whether it proved optimality, found a solution, its bound."""

    proved_optimal: bool
    proved_infeasible: bool
    has_solution: bool
    bound: float | None


@dataclass(kw_only=True, slots=True, frozen=True)
class RunSettings:
    """What a PuLP backend run reads: the solve's options and the MILP's own state."""

    options: SolveOptions
    """The solve's options as the backend got them (its seconds, threads, seed, progress)."""
    mip_start: bool
    """Whether a MIP start was put in the model (CBC is told to use it)."""
    started: float = 0.0
    """``time.monotonic()`` when the solve began (progress reports count from it)."""
    search: Search = field(default_factory=Search)
    """Asked to stop by a stop request or a failing callback: CBC gets SIGINT (and keeps
    its incumbent), HiGHS is cancelled."""


def run_backend(lp: pulp.LpProblem, backend: str, settings: RunSettings) -> RunOutcome:
    """Solve ``lp`` in place (variables get their values) with ``cbc`` or ``highs``."""
    if backend == "cbc":
        return _run_cbc(lp, settings)
    if backend == "highs":
        return _run_highs(lp, settings)
    raise ProblemError("backend", f"unknown {backend!r}; use one of {', '.join(BACKENDS)}")


def _cbc_command(settings: RunSettings, log_path: str, *, preprocess: bool) -> pulp.LpSolver:
    # CBC runs on one thread: its repeatable parallel mode (``threads 100+n``)
    # crashes in the CBC 2.10.3 that ships with PuLP, and its other parallel modes
    # are not repeatable, while the same seed must give the same schedule. The
    # seeds fix CBC's and CLP's random choices (0 would mean "from the clock").
    seed = settings.options.seed + 1
    options = [f"randomCbcSeed {seed}", f"randomSeed {seed}"]
    if not preprocess:
        options.append("preprocess off")
    if settings.options.threads > 1:
        log.debug("CBC runs single-threaded (repeatable); %d threads ignored",
                  settings.options.threads)  # fmt: skip
    remaining = settings.options.time_limit - (time.monotonic() - settings.started)
    kwargs = dict(
        msg=False,
        timeLimit=max(remaining, 0.1),
        options=options,
        warmStart=settings.mip_start,
        logPath=log_path,
    )
    cmd = pulp.COIN_CMD(**kwargs)
    if not cmd.available():  # the CBC binary that ships with PuLP
        cmd = pulp.COIN_CMD(path=pulp.PULP_CBC_CMD.pulp_cbc_path, **kwargs)
    return cmd


def _run_cbc(lp: pulp.LpProblem, settings: RunSettings) -> RunOutcome:
    """Run CBC; if it crashes, once more without preprocessing, then give up (no solution).

    CBC 2.10.3 (PuLP's) can crash when its time limit falls in preprocessing;
    the caller then falls back on the warm start.
    """
    bound = None
    for preprocess in (True, False):
        text, error = _cbc_once(lp, settings, preprocess=preprocess)
        if error is not None:
            bound = _cbc_bound(text)  # what the log said before CBC stopped
            remaining = settings.options.time_limit - (time.monotonic() - settings.started)
            if not preprocess or remaining < 1.0:
                log.warning("CBC failed (%s)", error)
                break
            log.warning("CBC failed (%s); retrying without preprocessing", error)
            continue
        optimal = lp.status == pulp.LpStatusOptimal and lp.sol_status == pulp.LpSolutionOptimal
        has_solution = lp.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
        infeasible = lp.status == pulp.LpStatusInfeasible and "infeasible" in text.lower()
        bound = pulp.value(lp.objective) if optimal else _cbc_bound(text)
        return RunOutcome(proved_optimal=optimal, proved_infeasible=infeasible,
                          has_solution=has_solution, bound=bound)  # fmt: skip
    return RunOutcome(proved_optimal=False, proved_infeasible=False, has_solution=False,
                      bound=bound)  # fmt: skip


def _cbc_once(
    lp: pulp.LpProblem, settings: RunSettings, *, preprocess: bool
) -> tuple[str, pulp.PulpSolverError | None]:
    """One CBC run: its log, and the error if CBC crashed or was killed."""
    if settings.search.stopped:
        return "", pulp.PulpSolverError(f"not started: {settings.search.reason}")
    fd, log_path = tempfile.mkstemp(prefix="pp_opt_cbc_", suffix=".log")
    os.close(fd)
    watcher = _LogWatcher(log_path, settings) if settings.options.progress else None
    remaining = settings.options.time_limit - (time.monotonic() - settings.started)
    grace = max(2.0, 0.05 * settings.options.time_limit)
    deadline = _Deadline(log_path, max(remaining, 0.1) + grace, grace, settings.search)
    error = None
    try:
        if watcher:
            watcher.start()
        with deadline:
            lp.solve(_cbc_command(settings, log_path, preprocess=preprocess))
    except pulp.PulpSolverError as err:
        error = err
    except BaseException:
        # KeyboardInterrupt (no signal handler installed) or any other error: never
        # leave CBC running on its own.
        _signal_children(log_path, signal.SIGKILL)
        raise
    finally:
        if watcher:
            watcher.stop()
        with open(log_path) as f:
            text = f.read()
        os.unlink(log_path)
    return text, error


class _Deadline:
    """Interrupts CBC once it overruns its time limit by a grace period, or when the
    search is asked to stop (a signal, a failing progress callback).

    CBC checks its limit only between nodes and cut passes, so on big models it
    can run well past it. On SIGINT it stops as on its own limit and writes its
    best solution; if it does not stop within the grace period it gets SIGKILL (its
    incumbent is lost and the caller uses the warm start). The CBC process is the
    child whose output goes to ``log_path`` (Linux ``/proc``; elsewhere only CBC's own
    limit applies).
    """

    def __init__(self, log_path: str, seconds: float, grace: float, search: Search) -> None:
        self._log_path, self._seconds, self._grace = log_path, seconds, grace
        self._search = search
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._wait, daemon=True)

    def __enter__(self) -> _Deadline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _wait(self) -> None:
        limit = time.monotonic() + self._seconds
        interrupted_at: float | None = None
        while not self._stop.wait(0.1):
            now = time.monotonic()
            if interrupted_at is None and (now >= limit or self._search.stopped):
                why = self._search.reason or "CBC overran its time limit"
                if _signal_children(self._log_path, signal.SIGINT, why):
                    interrupted_at = now
            elif interrupted_at is not None and now >= interrupted_at + self._grace:
                _signal_children(self._log_path, signal.SIGKILL, "CBC did not stop")
                return


def _signal_children(path: str, sig: signal.Signals, why: str = "") -> bool:
    """Send ``sig`` to the CBC child writing to ``path``; whether there was one."""
    pids = _children_writing_to(path)
    for pid in pids:
        log.info("%s; sending %s to CBC (pid %d)", why or "stopping", sig.name, pid)
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
    return bool(pids)


def _children_writing_to(path: str) -> list[int]:
    """Child processes of this one whose standard output is ``path``."""
    me = f"/proc/{os.getpid()}"
    try:
        children = []
        for task in os.listdir(f"{me}/task"):
            with open(f"{me}/task/{task}/children") as f:
                children += [int(pid) for pid in f.read().split()]
    except OSError:
        return []
    found = []
    for pid in children:
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == os.path.realpath(path):
                found.append(pid)
        except OSError:
            continue
    return found


_LOWER_BOUND = re.compile(r"^Lower bound:\s+(\S+)", re.MULTILINE)
_BEST_POSSIBLE = re.compile(r"best possible (\S+)")
_INTEGER_FOUND = re.compile(r"Integer solution of (\S+) found")
_RELAXATION = re.compile(r"Continuous objective value is (\S+)")


def _cbc_bound(text: str) -> float | None:
    """CBC's best bound: its summary's ``Lower bound:``, else the last ``best possible``,
    else the LP relaxation's value (all valid lower bounds)."""
    found = _LOWER_BOUND.findall(text) or _BEST_POSSIBLE.findall(text) or _RELAXATION.findall(text)
    try:
        return float(found[-1]) if found else None
    except ValueError:
        return None


class _LogWatcher:
    """Follows CBC's log while it runs and reports new incumbents and bounds."""

    def __init__(self, path: str, settings: RunSettings) -> None:
        self._path, self._settings = path, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._last: tuple[float | None, float | None] = (None, None)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _follow(self) -> None:
        offset, objective, bound = 0, None, None
        while not self._stop.wait(0.25):
            try:
                with open(self._path) as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
            except OSError:
                continue
            for value in _INTEGER_FOUND.findall(chunk):
                objective = _float_or(value, objective)
            for value in _BEST_POSSIBLE.findall(chunk):
                bound = _float_or(value, bound)
            if (objective, bound) != self._last and self._settings.options.progress:
                self._last = (objective, bound)
                elapsed = time.monotonic() - self._settings.started
                self._settings.options.progress(Progress(elapsed, objective, bound))


def _float_or(text: str, default: float | None) -> float | None:
    try:
        return float(text.rstrip(","))
    except ValueError:
        return default


class _WarmHiGHS(pulp.HiGHS):  # type: ignore[misc]  # PuLP has no type hints
    """PuLP's HiGHS interface, plus the variables' initial values as a MIP start and
    progress reports from HiGHS's callbacks."""

    def __init__(self, *, settings: RunSettings, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._settings = settings
        self._last: tuple[float | None, float | None] = (None, None)

    def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's name)
        highs = lp.solverModel
        if self._settings.mip_start:
            import highspy

            columns = sorted(lp.variables(), key=lambda v: v.index)
            solution = highspy.HighsSolution()
            solution.col_value = [float(v.varValue or 0.0) for v in columns]
            solution.value_valid = True
            highs.setSolution(solution)
        if self._settings.options.progress is not None:
            highs.cbMipImprovingSolution.subscribe(self._report)
            highs.cbMipLogging.subscribe(self._report)
        highs.HandleUserInterrupt = True  # a stop request (signal, failing callback) cancels
        self._settings.search.on_stop(highs.cancelSolve)
        if not self._settings.search.stopped:
            highs.run()

    def _report(self, event: object) -> None:
        out = event.data_out  # type: ignore[attr-defined]
        objective = out.mip_primal_bound if abs(out.mip_primal_bound) < 1e300 else None
        bound = out.mip_dual_bound if abs(out.mip_dual_bound) < 1e300 else None
        if (objective, bound) != self._last and self._settings.options.progress is not None:
            self._last = (objective, bound)
            elapsed = time.monotonic() - self._settings.started
            self._settings.options.progress(Progress(elapsed, objective, bound))


def _run_highs(lp: pulp.LpProblem, settings: RunSettings) -> RunOutcome:
    solver = _WarmHiGHS(
        settings=settings,
        msg=False,
        timeLimit=max(settings.options.time_limit - (time.monotonic() - settings.started), 0.1),
        threads=settings.options.threads,
        random_seed=settings.options.seed,
    )
    lp.solve(solver)
    import highspy

    model_status = lp.solverModel.getModelStatus()
    info = lp.solverModel.getInfo()
    optimal = model_status == highspy.HighsModelStatus.kOptimal
    infeasible = model_status == highspy.HighsModelStatus.kInfeasible
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    bound = float(info.mip_dual_bound) if abs(info.mip_dual_bound) < 1e300 else None
    return RunOutcome(proved_optimal=optimal, proved_infeasible=infeasible,
                      has_solution=has_solution, bound=bound)  # fmt: skip
