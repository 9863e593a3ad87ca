"""Ending a running search early and cleanly, keeping the best schedule it found.

Two things stop a search before its time limit:

- a signal, once the command line has installed :func:`stop_on_signals` (SIGINT from
  Ctrl-C, SIGTERM from a job scheduler): the first asks every running search to stop
  and keeps the best schedule; a second one raises ``KeyboardInterrupt`` (abort);
- a progress callback that raises: :func:`guarded` catches the error where the solver
  called it (inside OR-Tools, a CBC log watcher or a HiGHS callback, where an exception
  would abort the process or be lost), stops the search and logs the error.

Each backend runs its search inside :func:`running_search` and registers how to stop it
(:meth:`Search.on_stop`): CP-SAT's ``stop_search``, SIGINT to the CBC child process,
HiGHS's ``cancelSolve``. Signal handlers are process-wide by nature, so the searches
running now are kept in a module-level list (guarded by a lock); the library installs
no handler by itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from pp_opt.solvers.base import Progress, ProgressCallback

log = logging.getLogger(__name__)

_lock = threading.Lock()
_active: list[Search] = []
_requested: list[str] = []
"""Why the process was asked to stop (the first reason), while :func:`stop_on_signals`
is active; searches that start afterwards stop at once."""


class Search:
    """One running search: how to stop it, and why it was stopped (None while it runs)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._hooks: list[Callable[[], None]] = []

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the search is asked to stop (now, if it was already)."""
        with _lock:
            self._hooks.append(hook)
            fire = self.reason is not None
        if fire:
            _call(hook)

    def stop(self, reason: str) -> None:
        """Ask the search to stop (the first reason is kept); calls every hook once."""
        with _lock:
            if self.reason is not None:
                return
            self.reason = reason
            hooks = list(self._hooks)
        log.info("stopping the search: %s", reason)
        for hook in hooks:
            _call(hook)


def _call(hook: Callable[[], None]) -> None:
    try:
        hook()
    except Exception as err:  # a stop hook must never break the caller (a signal thread)
        log.warning("stopping the search failed: %s", err)


@contextlib.contextmanager
def running_search() -> Iterator[Search]:
    """A :class:`Search` that signals reach while the block runs."""
    search = Search()
    with _lock:
        _active.append(search)
        pending = _requested[0] if _requested else None
    if pending is not None:
        search.stop(pending)
    try:
        yield search
    finally:
        with _lock:
            _active.remove(search)


def request_stop(reason: str) -> None:
    """Ask every running search (and every search that starts later) to stop."""
    with _lock:
        if not _requested:
            _requested.append(reason)
        searches = list(_active)
    for search in searches:
        search.stop(reason)


def stop_requested() -> str | None:
    """Why the process was asked to stop, or None."""
    with _lock:
        return _requested[0] if _requested else None


def handling_signals() -> bool:
    """Whether :func:`stop_on_signals` is active (backends then leave SIGINT to it)."""
    return _scope_depth[0] > 0


_scope_depth = [0]


@contextlib.contextmanager
def relayed_signals() -> Iterator[None]:
    """Signals are handled elsewhere and arrive as :func:`request_stop` calls (in the child
    process of :mod:`pp_opt.solvers.isolation`): backends leave SIGINT alone, as under
    :func:`stop_on_signals`."""
    _scope_depth[0] += 1
    try:
        yield
    finally:
        _scope_depth[0] -= 1


def guarded(progress: ProgressCallback | None, search: Search) -> ProgressCallback | None:
    """``progress`` wrapped so that an error in it stops ``search`` instead of escaping.

    After the first error the callback is not called again; the error is logged and kept
    as the search's stop reason.
    """
    if progress is None:
        return None
    failed: list[BaseException] = []

    def report(update: Progress) -> None:
        if failed:
            return
        try:
            progress(update)
        except BaseException as err:  # it must not unwind into a solver's native code
            failed.append(err)
            reason = f"progress callback raised {type(err).__name__}: {err}"
            log.warning("%s; stopping the search, keeping the best schedule", reason)
            search.stop(reason)
            if isinstance(err, KeyboardInterrupt):
                request_stop("interrupted")

    return report


@contextlib.contextmanager
def stop_on_signals(
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[None]:
    """SIGINT/SIGTERM end the running search cleanly (first) or abort (second).

    For the command line: on the first signal every search stops at once and keeps its
    best schedule (even while the main thread is inside native solver code: a watcher
    thread woken through ``signal.set_wakeup_fd`` does the stopping); the run then goes
    on to save it. A second signal raises ``KeyboardInterrupt`` in the main thread. Does
    nothing outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    count = [0]

    def on_signal(signum: int, frame: FrameType | None) -> None:
        count[0] += 1
        if count[0] > 1:
            raise KeyboardInterrupt

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    old_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(read_fd,), daemon=True)
    watcher.start()
    _scope_depth[0] += 1
    with _lock:
        _requested.clear()
    try:
        yield
    finally:
        _scope_depth[0] -= 1
        with _lock:
            _requested.clear()
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_fd)  # ends the watcher (it reads end of file)
        watcher.join(timeout=1.0)
        os.close(read_fd)


def _watch(read_fd: int) -> None:
    """Turn each signal byte written to the wakeup pipe into a stop request."""
    seen = 0
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            seen += 1
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = str(signum)
            if seen == 1:
                request_stop(f"interrupted by {name}")
