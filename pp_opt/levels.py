"""Memory levels summed exactly: the metrics and the validator add memory deltas here.

Adding floats one by one rounds at every step: a forward that keeps ``0.1`` twice and a
recompute of ``0.4`` reach ``0.6000000000000001`` against a cap of ``0.6``. A level is
meant to be the sum of the amounts the problem gives (decimals, as written), so each
running sum is taken exactly in those decimals and rounded once.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from fractions import Fraction

MAX_DECIMALS = 30
"""Amounts with more decimal places than this (as ``repr`` writes them) are summed as
exact binary fractions instead."""


def running_levels(start: float, deltas: Iterable[float]) -> list[float]:
    """``start + deltas[0]``, ``start + deltas[0] + deltas[1]``, ...: each exact, rounded once."""
    deltas = list(deltas)
    digits = {value: _decimals(value) for value in {start, *deltas}}
    places = max(digits.values())
    if places <= MAX_DECIMALS:
        scale = 10**places
        whole = {value: int(Decimal(repr(value)).scaleb(places)) for value in digits}
        level = whole[start]
        levels = []
        for delta in deltas:
            level += whole[delta]
            levels.append(level / scale)  # an int ratio: rounded once, correctly
        return levels
    exact = {value: Fraction(value) for value in digits}
    total = exact[start]
    out = []
    for delta in deltas:
        total += exact[delta]
        out.append(float(total))
    return out


def _decimals(value: float) -> int:
    """Decimal places of ``value`` as ``repr`` writes it (more than any limit if not finite)."""
    text = Decimal(repr(value))
    if not text.is_finite():
        return MAX_DECIMALS + 1
    exponent = text.as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else MAX_DECIMALS + 1
