"""Process handling of a solve: stopping it early, and its native code in a child process.

- :mod:`.stop`: :class:`~.stop.StopToken`, the caller's request to end a solve early
  (keeping the best schedule), the :class:`~.stop.Search` each backend registers its stop
  hooks on, and the command line's signal handling (:func:`~.stop.stop_on_signals`).
- :mod:`.isolation`: each solve's backends and search in one child process, so an abort
  in native code costs only that job's answer; :mod:`.child` is that process's side.
"""
