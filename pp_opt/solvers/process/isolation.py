"""Running backends and the search in a child process, so native code cannot end the run.

OR-Tools, CBC and HiGHS are native code: an abort (``Check failed: ...``), a segfault or an
out-of-memory kill inside them would take the whole process down with the schedules found
so far. :func:`isolated` (on :func:`pp_opt.solvers.solve`) gives each solve one child
process, started as the solve begins (it imports the solver while the warm starts are
computed) and reused by every phase of that solve; :func:`run_isolated`,
:func:`improve_isolated` and :func:`fluid_isolated` send it one job each. The child reports
progress, log records and the search's incumbents back through a pipe; the progress
callback runs here, in the parent.

When the child dies, the job's answer is lost and nothing else: the backend answers
``timeout`` with no ops, the search keeps its last reported incumbent, the solve carries on
with what it has (the warm start at least), one warning says which backend died and how
(``SIGABRT``, ``exit code 1``), and the solve records it in ``solver.extra["backend_failure"]``
(the command line then exits with ``exit_codes.BACKEND_FAILED``). A child that does not
stop within :data:`GRACE` seconds of its time limit is killed. A stop request (a signal, a
failing progress callback) reaches the child through the pipe.

The child is a plain ``python`` process (not ``multiprocessing``), so a solve works from
any caller: a script without a ``__main__`` guard, a ``ProcessPoolExecutor`` worker, a Ray
worker. ``PP_OPT_IN_PROCESS=1`` runs everything in the calling process instead (for a
debugger or a profiler); ``PP_OPT_CHILD_FAULT=<job>:<how>`` (job ``backend``, ``search``
or ``fluid``, how ``abort``, ``kill`` or ``exit``) makes the child fail on purpose, for
tests.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import networkx as nx

from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, Status
from pp_opt.solvers.base import BackendResult, SolveOptions
from pp_opt.solvers.process.stop import Search, StopToken

if TYPE_CHECKING:
    from pp_opt.solvers.fluid import FluidBound

log = logging.getLogger(__name__)

IN_PROCESS_ENV = "PP_OPT_IN_PROCESS"
FAULT_ENV = "PP_OPT_CHILD_FAULT"

GRACE = 1.0
"""Seconds a child may run past its job's time limit before it is asked to stop; after as
many again it is killed."""

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(kw_only=True, slots=True, frozen=True)
class Failure:
    """A child process that died during a job."""

    backend: str
    """What ran in it: ``cpsat``, ``milp``, ``milp-highs`` or ``search``."""
    how: str
    """``SIGABRT``, ``SIGKILL`` (often: out of memory), ``exit code N``, or ``killed: ...``."""

    def as_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "how": self.how}


@dataclass(kw_only=True, slots=True)
class SearchOutcome:
    """What the large-neighbourhood search returned (see :func:`improve`)."""

    best: Schedule
    windows: int
    improvements: int


class _ChildDied(Exception):
    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.how = how


def in_process() -> bool:
    """Whether ``PP_OPT_IN_PROCESS`` asks for no child process."""
    return os.environ.get(IN_PROCESS_ENV, "") not in ("", "0")


# --- the child, as the parent sees it -------------------------------------------------------


class _Child:
    """One child process and its end of the pipe."""

    def __init__(self, preload: str) -> None:
        mine, theirs = socket.socketpair()
        code = (
            f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
            "from pp_opt.solvers.process.child import main; main()"
        )
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, str(theirs.fileno()), preload],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C reaches the parent only; it relays a stop
            )
        finally:
            theirs.close()
        self.conn = Connection(mine.detach())
        self._send_lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock, contextlib.suppress(OSError):
            self.conn.send(message)

    def alive(self) -> bool:
        return self.process.poll() is None

    def how_it_died(self) -> str:
        try:
            code = self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.kill()
            return "stopped answering (killed)"
        if code < 0:
            try:
                return signal.Signals(-code).name
            except ValueError:
                return f"signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2.0)

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not at once."""
        if self.alive():
            self.send(("quit",))
            try:
                self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(OSError):
            self.conn.close()


class Session:
    """The child process of one solve (started at once, restarted after a death) and the
    failures seen."""

    def __init__(self, preload: str) -> None:
        self._preload = preload
        self._child: _Child | None = None
        self.failures: list[Failure] = []

    def start(self) -> _Child:
        if self._child is None or not self._child.alive():
            self._child = _Child(self._preload)
        return self._child

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

    def run(
        self,
        job: tuple[Any, ...],
        *,
        name: str,
        seconds: float,
        search: Search,
        on_message: Callable[[str, Any], None],
    ) -> Any:
        """Send ``job`` to the child and wait for its answer, at most ``seconds`` plus the
        grace periods; other messages go to ``on_message``; stopping ``search`` stops the
        child's. Raises :class:`_ChildDied`."""
        child = self.start()
        # The wall clock of the sending (shared by both processes) lets the child take the
        # transfer of a large job out of its own time.
        sent = (seconds, time.time())
        child.send(("job", *job, sent, logging.getLogger("pp_opt").getEffectiveLevel()))
        # After the job: the child relays a stop to the job it received last.
        search.on_stop(lambda: child.send(("stop", search.reason or "stopped")))
        try:
            return self._wait(child, name, time.perf_counter() + seconds, on_message)
        except _ChildDied as died:
            self._child = None
            self.failures.append(Failure(backend=name, how=died.how))
            log.warning("the %s backend died (%s); keeping the best schedule so far",
                        name, died.how)  # fmt: skip
            raise
        except BaseException:  # KeyboardInterrupt (a second Ctrl-C): never leave it running
            child.kill()
            self._child = None
            raise

    @staticmethod
    def _wait(
        child: _Child, name: str, deadline: float, on_message: Callable[[str, Any], None]
    ) -> Any:
        asked_at: float | None = None
        while True:
            now = time.perf_counter()
            if asked_at is None and now > deadline + GRACE:
                # routine (it stops and its best is kept): a plan's hundreds of solves would
                # each print it; one that does not stop is killed and warned about below
                log.info("%s: still running %.1f s after its time limit; stopping it",
                         name, now - deadline)  # fmt: skip
                child.send(("stop", "time limit"))
                asked_at = now
            elif asked_at is not None and now > asked_at + GRACE:
                child.kill()
                raise _ChildDied(f"killed: did not stop {now - deadline:.1f} s after its limit")
            try:
                ready = child.conn.poll(0.05)
                message = child.conn.recv() if ready else None
            except (EOFError, OSError):
                raise _ChildDied(child.how_it_died()) from None
            if message is None:
                if not child.alive():
                    raise _ChildDied(child.how_it_died())
                continue
            kind, payload = message
            if kind == "done":
                return payload
            if kind == "error":
                _raise_child_error(payload)
            if kind == "log":
                level, logger, text = payload
                logging.getLogger(logger).log(level, "%s", text)
            else:
                on_message(kind, payload)


def _raise_child_error(payload: tuple[bytes | None, str]) -> None:
    """Re-raise a Python exception of the child here (its own type when it unpickles)."""
    blob, text = payload
    error: BaseException | None = None
    if blob is not None:
        with contextlib.suppress(Exception):
            error = pickle.loads(blob)  # noqa: S301 - our own child's answer
    if error is None:
        error = RuntimeError(f"the solver's child process failed:\n{text}")
    raise error


_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "pp_opt_isolation_session", default=None
)


def isolated(solve: Callable[P, R]) -> Callable[P, R]:
    """``solve`` with one child process for its backend and search (see the module doc);
    a failure is recorded in the result's ``schedule.solver.extra["backend_failure"]``."""

    @functools.wraps(solve)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if in_process() or _session.get() is not None:
            return solve(*args, **kwargs)
        solver = kwargs.get("solver", "cpsat")
        session = Session(solver if isinstance(solver, str) else "cpsat")
        token = _session.set(session)
        try:
            if _small(args[0] if args else kwargs.get("problem")):
                with contextlib.suppress(OSError):
                    session.start()  # imports the solver while the warm starts are computed
            result = solve(*args, **kwargs)
            schedule = getattr(result, "schedule", None)
            if session.failures and isinstance(schedule, Schedule):
                schedule.solver.extra["backend_failure"] = session.failures[0].as_dict()
            return result
        finally:
            _session.reset(token)
            session.close()

    return wrapper


PRESTART_OPS = 20_000
"""Up to this many ops the child starts with the solve; larger problems spend seconds on
their warm starts, and their search may find no time to start at all."""


def _small(problem: object) -> bool:
    from pp_opt.dag import op_count

    return not isinstance(problem, Problem) or op_count(problem) <= PRESTART_OPS


def _usable(session: Session | None) -> Session | None:
    """``session`` with its child running, or None (then the job runs in this process)
    when there is no session or no child process can be started here."""
    if session is None:
        return None
    try:
        session.start()
    except OSError as err:
        log.warning("cannot start a child process (%s); solving in this one", err)
        return None
    return session


# --- the three jobs ---------------------------------------------------------------------------


def run_isolated(
    solver: str,
    backend: Callable[[], Callable[[Problem, nx.DiGraph, SolveOptions], BackendResult]],
    problem: Problem,
    dag: nx.DiGraph,
    options: SolveOptions,
) -> BackendResult:
    """``backend()(problem, dag, options)`` in the solve's child process (in this one when
    there is none; ``backend`` imports it); a dead child answers ``timeout`` without ops."""
    session = _usable(_session.get())
    if session is None:
        return backend()(problem, dag, options)
    from pp_opt.solvers.process.stop import guarded, running_search

    started = time.perf_counter()
    shipped = dataclasses.replace(options, progress=None, stop=None)  # the child has its own
    with running_search(options.stop) as search:
        report = guarded(options.progress, search)

        def on_message(kind: str, payload: Any) -> None:
            if kind == "progress" and report is not None:
                report(payload)

        try:
            result: BackendResult = session.run(
                ("backend", solver, problem, dag, shipped, options.progress is not None),
                name=solver, seconds=options.time_limit, search=search, on_message=on_message,
            )  # fmt: skip
        except _ChildDied:
            return BackendResult(status=Status.TIMEOUT, objective=None, bound=None,
                                 seconds=time.perf_counter() - started, ops=None)  # fmt: skip
    return result


def improve_isolated(
    schedule: Schedule,
    *,
    deadline: float,
    threads: int,
    seed: int,
    on_improve: Callable[[Schedule], None],
    search: Search,
) -> SearchOutcome:
    """The large-neighbourhood search (:func:`pp_opt.solvers.lns.improve`) from ``schedule``
    until ``deadline`` in the solve's child process (in this one when there is none); a dead
    child leaves the last incumbent it reported. Stopping ``search`` stops it."""
    session = _usable(_session.get())
    if session is None:
        from pp_opt.solvers.lns import SearchStats
        from pp_opt.solvers.lns import improve as search_improve  # OR-Tools loads slowly

        stats = SearchStats()
        here = search_improve(schedule, deadline=deadline, threads=threads, seed=seed,
                              on_improve=on_improve, stats=stats, search=search)  # fmt: skip
        return SearchOutcome(best=here, windows=stats.windows, improvements=stats.improvements)
    best = [schedule]

    def on_message(kind: str, payload: Any) -> None:
        if kind == "improved":
            best[0] = payload
            on_improve(payload)

    seconds = deadline - time.perf_counter()
    try:
        windows, improvements = session.run(
            ("search", schedule, threads, seed), name="search", seconds=seconds,
            search=search, on_message=on_message,
        )  # fmt: skip
    except _ChildDied:
        return SearchOutcome(best=best[0], windows=0, improvements=0)
    return SearchOutcome(best=best[0], windows=windows, improvements=improvements)


def fluid_isolated(
    problem: Problem, *, lower: float, upper: float, seconds: float, stop: StopToken | None = None
) -> FluidBound | None:
    """:func:`pp_opt.solvers.fluid.fluid_bound` (HiGHS, native) in the solve's child process
    (in this one when there is none); a dead child gives no bound; ``stop`` ends it."""
    session = _usable(_session.get())
    if session is None:
        from pp_opt.solvers.fluid import fluid_bound

        deadline = time.perf_counter() + seconds
        return fluid_bound(problem, lower=lower, upper=upper, deadline=deadline)
    from pp_opt.solvers.process.stop import running_search

    with running_search(stop) as search:
        try:
            found: FluidBound | None = session.run(
                ("fluid", problem, lower, upper), name="fluid bound", seconds=seconds,
                search=search, on_message=lambda kind, payload: None,
            )  # fmt: skip
        except _ChildDied:
            return None
    return found
