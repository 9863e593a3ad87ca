"""The sizes and magnitudes pp_opt accepts, checked up front in one place.

Beyond these, building the op DAG, timing or validating a schedule would take minutes
and gigabytes before any answer, so a problem outside them is refused at once with a
one-line error instead. Every entry point that creates a problem size (problem files,
:class:`~pp_opt.problem.Problem`, placements, the profiler's layouts, re-splitting)
calls :func:`check_size`; every time or memory number goes through
:func:`check_magnitude`.
"""

from __future__ import annotations

import math

from pp_opt.errors import ProblemError

MAX_DEVICES = 1024
"""``p``: pipeline ranks."""
MAX_CHUNKS = 64
"""``v``: stages (chunks) per device."""
MAX_MICROBATCHES = 10_000
"""``m``: microbatches per iteration."""
MAX_ACTIVATIONS = 50_000
"""Stages times microbatches (each is one ``F`` and its backward ops): about 150 000
to 250 000 ops, which a solve handles within a minute."""
MAX_VALUE = 1e15
"""Largest time or memory amount (bytes: a petabyte); sums over a schedule stay exact
enough in floating point and fit the solvers' integer scaling."""


def check_size(
    *, p: int | None = None, v: int | None = None, m: int | None = None, stages: int | None = None
) -> None:
    """Raise :class:`ProblemError` naming the first number beyond its limit.

    ``stages`` (the number of pipeline stages) is checked together with ``m``.
    """
    for name, value, limit, what in (
        ("p", p, MAX_DEVICES, "devices"),
        ("v", v, MAX_CHUNKS, "chunks per device"),
        ("m", m, MAX_MICROBATCHES, "microbatches"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise ProblemError(name, f"got {value}; pp_opt handles at most {limit} {what}")
    if stages is not None and m is not None and stages * m > MAX_ACTIVATIONS:
        raise ProblemError(
            "m",
            f"{stages} stages x {m} microbatches = {stages * m} activations; pp_opt handles "
            f"at most {MAX_ACTIVATIONS}: use fewer microbatches or chunks",
        )


def check_magnitude(field: str, value: float) -> float:
    """``value`` when it is finite and at most :data:`MAX_VALUE` in size."""
    if not math.isfinite(value):
        raise ProblemError(field, f"got {value}; expected a finite number")
    if abs(value) > MAX_VALUE:
        raise ProblemError(
            field, f"got {value:g}; pp_opt takes numbers up to {MAX_VALUE:g} (change the unit)"
        )
    return value
