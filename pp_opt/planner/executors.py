"""Where jobs run: in this process, in a local process pool, or as Ray tasks.

An executor is a parameter of the plan, not a branch inside its steps: it takes
:class:`~pp_opt.planner.evaluate.EvaluationTask` values and hands back
:class:`~pp_opt.planner.evaluate.Scored` values, one at a time as they finish (ties in finishing
go to the job submitted first).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol, runtime_checkable

from pp_opt.errors import ProblemError
from pp_opt.planner.evaluate import EvaluationTask, Scored, evaluate
from pp_opt.solvers.process.stop import StopToken

log = logging.getLogger(__name__)


@runtime_checkable
class Executor(Protocol):
    """Runs jobs; :meth:`next_done` returns the next finished one."""

    workers: int
    """Jobs that run at once."""

    def submit(self, job: EvaluationTask) -> None: ...

    def next_done(self) -> Scored: ...

    def pending(self) -> int: ...

    def close(self) -> None: ...


class SerialExecutor:
    """Runs each job in this process when its result is asked for."""

    def __init__(self, stop: StopToken | None = None) -> None:
        self.workers = 1
        self._jobs: deque[EvaluationTask] = deque()
        self._stop = stop

    def submit(self, job: EvaluationTask) -> None:
        self._jobs.append(job)

    def next_done(self) -> Scored:
        return evaluate(self._jobs.popleft(), stop=self._stop)

    def pending(self) -> int:
        return len(self._jobs)

    def close(self) -> None:
        self._jobs.clear()


def _leave_signals_to_the_parent() -> None:
    """Workers ignore SIGINT: Ctrl-C reaches the whole process group, and the plan (in the
    parent) stops submitting and keeps what its workers finish."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class PoolExecutor:
    """A local pool of ``workers`` processes (spawned: nothing of this process is shared)."""

    def __init__(self, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ProblemError("workers", f"got {workers!r}; give an integer of at least 1")
        self.workers = workers
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_leave_signals_to_the_parent
        )
        self._futures: dict[Future[Scored], int] = {}
        self._count = 0

    def submit(self, job: EvaluationTask) -> None:
        self._futures[self._pool.submit(evaluate, job)] = self._count
        self._count += 1

    def next_done(self) -> Scored:
        done, _ = wait(list(self._futures), return_when=FIRST_COMPLETED)
        first = min(done, key=self._futures.__getitem__)
        del self._futures[first]
        return first.result()

    def pending(self) -> int:
        return len(self._futures)

    def close(self) -> None:
        for future in self._futures:
            future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._futures.clear()


class RayExecutor:
    """Ray tasks on the cluster at ``address`` (``auto``: the one the environment names; an
    already initialised Ray runtime is used as it is). ``workers``: tasks in flight."""

    def __init__(self, address: str | None, workers: int) -> None:
        try:
            import ray
        except ImportError:
            raise ProblemError(
                "ray", "Ray is not installed; pip install 'pp-opt[ray]' or drop --ray"
            ) from None
        self._ray: Any = ray
        if not ray.is_initialized():
            try:
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as err:
                where = address or "a new local runtime"
                raise ProblemError(
                    "ray",
                    f"cannot start or join Ray at {where} ({err}); start a cluster "
                    "(ray start --head) or use --ray local",
                ) from None
        self.workers = workers
        self._remote = ray.remote(num_cpus=1)(evaluate)
        self._refs: dict[Any, int] = {}
        self._count = 0

    def submit(self, job: EvaluationTask) -> None:
        self._refs[self._remote.remote(job)] = self._count
        self._count += 1

    def next_done(self) -> Scored:
        ready, _ = self._ray.wait(list(self._refs), num_returns=1)
        first = min(ready, key=self._refs.__getitem__)
        del self._refs[first]
        result: Scored = self._ray.get(first)
        return result

    def pending(self) -> int:
        return len(self._refs)

    def close(self) -> None:
        for ref in self._refs:
            self._ray.cancel(ref)
        self._refs.clear()


def make_executor(
    *, workers: int = 1, ray: str | None = None, stop: StopToken | None = None
) -> Executor:
    """Ray when ``ray`` names a cluster (``auto`` or an address), else a pool of ``workers``
    processes, or this process for one worker."""
    if ray is not None:
        return RayExecutor(None if ray == "local" else ray, workers)
    if workers == 1:
        return SerialExecutor(stop)
    return PoolExecutor(workers)
