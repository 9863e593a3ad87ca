"""The child process of :mod:`pp_opt.solvers.process.isolation`: runs backend and search jobs.

Started by the parent as ``python -c "...main()" FD PRELOAD``: ``FD`` is its end of a
socket pair, ``PRELOAD`` the solver whose modules it imports at once (while the parent
computes the warm starts). It answers each job with ``("done", answer)`` or ``("error",
...)``, sends ``("progress", Progress)``, ``("improved", Schedule)`` and ``("log", ...)``
on the way, turns ``("stop", reason)`` into a request of the running job's
:class:`~pp_opt.solvers.process.stop.StopToken` (each job gets its own), and exits on
``("quit",)`` or when the parent goes away.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pp_opt.solvers.process.stop import StopToken

log = logging.getLogger(__name__)


class _Channel:
    """The child's end of the pipe; sends from any thread (CP-SAT calls back from its own)."""

    def __init__(self, fd: int) -> None:
        self.conn = Connection(fd)
        self._lock = threading.Lock()

    def send(self, message: tuple[str, Any]) -> None:
        with self._lock:
            try:
                self.conn.send(message)
            except OSError:  # the parent is gone: nobody wants the answer
                os._exit(1)


class _Forward(logging.Handler):
    """Sends each log record to the parent, which logs it under the same name and level."""

    def __init__(self, channel: _Channel) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self._channel.send(("log", (record.levelno, record.name, record.getMessage())))


def main() -> None:
    """Serve jobs until the parent says ``quit`` or goes away."""
    from pp_opt.solvers.process.stop import StopToken, relayed_signals

    gc.set_threshold(10_000, 10, 10)  # as pp_opt.cli.relax_garbage_collection: our process
    channel = _Channel(int(sys.argv[1]))
    root = logging.getLogger()
    root.handlers[:] = [_Forward(channel)]
    jobs: queue.Queue[tuple[tuple[Any, ...], StopToken]] = queue.Queue()
    latest = [StopToken()]  # the token of the job sent last (a stop follows its job)

    def listen() -> None:
        while True:
            try:
                message = channel.conn.recv()
            except (EOFError, OSError):
                os._exit(1)  # the parent died: stop at once
            if message[0] == "stop":
                latest[0].request(message[1])
            elif message[0] == "quit":
                os._exit(0)  # nothing to clean up; skip the solvers' slow teardown
            else:
                latest[0] = StopToken()
                jobs.put((message, latest[0]))

    threading.Thread(target=listen, daemon=True).start()
    _preload(sys.argv[2] if len(sys.argv) > 2 else "cpsat")
    with relayed_signals():
        while True:
            (_, kind, *args), stop = jobs.get()
            *payload, (limit, sent_at), level = args
            seconds = max(0.0, limit - max(0.0, time.time() - sent_at))
            root.setLevel(level)
            try:
                _fault(kind)
                answer = _run(kind, payload, seconds, channel, stop)
            except BaseException as err:
                channel.send(("error", (_pickled(err), traceback.format_exc())))
            else:
                channel.send(("done", answer))


def _preload(solver: str) -> None:
    """Import what the first job will need (an error here shows up in that job)."""
    with contextlib.suppress(Exception):
        if solver in ("milp", "milp-highs"):
            import pp_opt.solvers.milp  # noqa: F401
        else:
            import pp_opt.solvers.cpsat  # noqa: F401
            import pp_opt.solvers.lns  # noqa: F401


def _run(kind: str, payload: list[Any], seconds: float, channel: _Channel, stop: StopToken) -> Any:
    from pp_opt.solvers.base import Progress

    if kind == "backend":
        from pp_opt.solvers.entry import _backend

        solver, problem, dag, options, reports = payload

        def progress(update: Progress) -> None:
            channel.send(("progress", update))

        here = replace(options, time_limit=seconds, progress=progress if reports else None,
                       stop=stop)  # fmt: skip
        return _backend(solver)(problem, dag, here)
    if kind == "fluid":
        from pp_opt.solvers.fluid import fluid_bound

        problem, lower, upper = payload
        return fluid_bound(problem, lower=lower, upper=upper,
                           deadline=time.perf_counter() + seconds)  # fmt: skip
    from pp_opt.solvers.lns import SearchStats, improve
    from pp_opt.solvers.process.stop import running_search

    schedule, threads, seed = payload
    stats = SearchStats()
    with running_search(stop) as search:
        improve(schedule, deadline=time.perf_counter() + seconds, threads=threads, seed=seed,
                on_improve=lambda better: channel.send(("improved", better)), stats=stats,
                search=search)  # fmt: skip
    return stats.windows, stats.improvements


def _fault(kind: str) -> None:
    """Fail on purpose when ``PP_OPT_CHILD_FAULT`` names this job (tests only)."""
    from pp_opt.solvers.process.isolation import FAULT_ENV

    job, _, how = os.environ.get(FAULT_ENV, "").partition(":")
    if job != kind:
        return
    if how == "abort":
        os.abort()
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        os._exit(3)


def _pickled(err: BaseException) -> bytes | None:
    """``err`` pickled when it also unpickles (many exceptions with custom ``__init__`` do not)."""
    try:
        blob = pickle.dumps(err)
        pickle.loads(blob)  # noqa: S301 - our own bytes
    except Exception:
        return None
    return blob
