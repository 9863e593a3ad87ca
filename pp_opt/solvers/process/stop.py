"""Ending a running search early and cleanly, keeping the best schedule it found.

Three things stop a search before its time limit:

- a :class:`StopToken` the caller created and passed in (``pp_opt.solve(..., stop=token)``):
  ``token.request(reason)`` from any thread stops every search running under it, and
  every search that starts under it later;
- a signal, once the command line has installed :func:`stop_on_signals` with its token
  (SIGINT from Ctrl-C, SIGTERM from a job scheduler): the first requests the token (every
  running search stops and keeps its best schedule); a second one raises
  ``KeyboardInterrupt`` (abort);
- a progress callback that raises: :func:`guarded` catches the error where the solver
  called it (inside OR-Tools, a CBC log watcher or a HiGHS callback, where an exception
  would abort the process or be lost), stops the search and logs the error.

Each backend runs its search inside :func:`running_search` with the solve's token and
registers how to stop it (:meth:`Search.on_stop`): CP-SAT's ``stop_search``, SIGINT to
the CBC child process, HiGHS's ``cancelSolve``. The library installs no signal handler by
itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TypeVar

log = logging.getLogger(__name__)

U = TypeVar("U")
"""What a progress callback is called with (:class:`pp_opt.solvers.base.Progress`)."""


class StopToken:
    """A request to end a solve (or a plan) early, keeping the best schedule found.

    The caller creates one, passes it in (``pp_opt.solve(problem, stop=token)``) and calls
    :meth:`request` from anywhere (a signal handler's thread, a progress callback, another
    thread). Only the first reason is kept. Thread-safe; not picklable (it lives in the
    process that created it: a child process gets its own, relayed over its pipe).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._searches: list[Search] = []

    @property
    def requested(self) -> str | None:
        """Why a stop was requested (the first reason), or None while none was."""
        with self._lock:
            return self._reason

    def request(self, reason: str) -> None:
        """Stop every search running under this token, and every one that starts later."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
            searches = list(self._searches)
        for search in searches:
            search.stop(reason)

    def _attach(self, search: Search) -> str | None:
        """Stop ``search`` with the others from now on; the reason if one was requested."""
        with self._lock:
            self._searches.append(search)
            return self._reason

    def _detach(self, search: Search) -> None:
        with self._lock:
            self._searches.remove(search)


class Search:
    """One running search: how to stop it, and why it was stopped (None while it runs)."""

    def __init__(self, token: StopToken | None = None) -> None:
        self.token = token if token is not None else StopToken()
        """The token the search runs under (its own when none was given)."""
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the search is asked to stop (now, if it was already)."""
        with self._lock:
            self._hooks.append(hook)
            fire = self.reason is not None
        if fire:
            _call(hook)

    def stop(self, reason: str) -> None:
        """Ask the search to stop (the first reason is kept); calls every hook once."""
        with self._lock:
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
def running_search(token: StopToken | None = None) -> Iterator[Search]:
    """A :class:`Search` that ``token`` stops while the block runs (at once when it was
    requested already); with no token, one that only its own hooks and callbacks stop."""
    search = Search(token)
    pending = search.token._attach(search)
    if pending is not None:
        search.stop(pending)
    try:
        yield search
    finally:
        search.token._detach(search)


def guarded(progress: Callable[[U], None] | None, search: Search) -> Callable[[U], None] | None:
    """``progress`` wrapped so that an error in it stops ``search`` instead of escaping.

    After the first error the callback is not called again; the error is logged and kept
    as the search's stop reason. A ``KeyboardInterrupt`` in it stops the whole solve (the
    search's token).
    """
    if progress is None:
        return None
    failed: list[BaseException] = []

    def report(update: U) -> None:
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
                search.token.request("interrupted")

    return report


_scope_depth = [0]
"""How many :func:`stop_on_signals` / :func:`relayed_signals` scopes are open in this
process (signal handlers are process-wide, so this is process state by nature)."""


def handling_signals() -> bool:
    """Whether :func:`stop_on_signals` is active (backends then leave SIGINT to it)."""
    return _scope_depth[0] > 0


@contextlib.contextmanager
def relayed_signals() -> Iterator[None]:
    """Signals are handled elsewhere and arrive as stop requests (in the child process of
    :mod:`pp_opt.solvers.process.isolation`): backends leave SIGINT alone, as under
    :func:`stop_on_signals`."""
    _scope_depth[0] += 1
    try:
        yield
    finally:
        _scope_depth[0] -= 1


@contextlib.contextmanager
def stop_on_signals(
    token: StopToken,
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[StopToken]:
    """SIGINT/SIGTERM request ``token`` (first) or abort (second); yields ``token``.

    For the command line: on the first signal every search running under ``token`` stops
    at once and keeps its best schedule (even while the main thread is inside native
    solver code: a watcher thread woken through ``signal.set_wakeup_fd`` does the
    requesting); the run then goes on to save it. A second signal raises
    ``KeyboardInterrupt`` in the main thread. Installs nothing outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield token
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
    watcher = threading.Thread(target=_watch, args=(read_fd, token), daemon=True)
    watcher.start()
    _scope_depth[0] += 1
    try:
        yield token
    finally:
        _scope_depth[0] -= 1
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_fd)  # ends the watcher (it reads end of file)
        watcher.join(timeout=1.0)
        os.close(read_fd)


def _watch(read_fd: int, token: StopToken) -> None:
    """Turn the first signal byte written to the wakeup pipe into a request of ``token``."""
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
                token.request(f"interrupted by {name}")
