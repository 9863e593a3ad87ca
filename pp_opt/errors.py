"""Errors that carry a one-line message for the user: which field, and how to fix it.

Library messages name the Python argument or file field (``cap``, ``time_limit``); the
command line writes its own flags instead (``--cap``, ``--time-limit``) from the
structured fields, so each error says how to fix the input in the caller's terms.
:class:`~pp_opt.validator.ValidationError` lives with the violations it lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from decimal import ROUND_CEILING, Decimal


def _as_is(name: str) -> str:
    return name


def ceil_significant(value: float, digits: int = 6) -> str:
    """``value`` rounded *up* to ``digits`` significant digits, as text.

    The number printed is never below ``value`` once read back as a float, so a cap
    printed with it is a cap that works.
    """
    if not math.isfinite(value) or value <= 0:
        return f"{value:g}"
    exact = Decimal(repr(value))  # the shortest text that reads back as ``value``
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    rounded = exact.quantize(step, rounding=ROUND_CEILING)
    while float(rounded) < value:
        rounded += step
    text = format(rounded.normalize(), "f")
    return text


def memory_text(value: float, unit: str) -> str:
    """A memory amount in the problem's unit, rounded up, with the unit said.

    Bytes are whole bytes (with GiB for reading); ``m_b`` amounts are multiples of one
    activation, six significant digits.
    """
    if unit == "bytes" and math.isfinite(value):
        return f"{math.ceil(value)} bytes ({value / 1024**3:.2f} GiB)"
    return f"{ceil_significant(value)} (unit: M_B, one activation)"


def amount_text(value: float, unit: str) -> str:
    """A need or a cap as read: GiB (two decimals) for bytes, else six significant digits."""
    if unit == "bytes" and math.isfinite(value):
        return f"{value / 1024**3:.2f} GiB"
    return ceil_significant(value)


class PPOptError(Exception):
    """Base class of every error pp_opt raises on purpose (the CLI prints it as one line)."""

    exit_code = 1

    def describe(self, name: Callable[[str], str] = _as_is) -> str:
        """The message with argument names spelled by ``name`` (the CLI passes its flags)."""
        return str(self)


class FieldError(PPOptError):
    """An error about one named argument or file field, said as ``field: message``."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        """The argument or file field at fault (``""`` when it is the whole input)."""
        self.message = message
        """What is wrong and how to fix it."""
        super().__init__(f"{field}: {message}" if field else message)

    def describe(self, name: Callable[[str], str] = _as_is) -> str:
        return f"{name(self.field)}: {self.message}" if self.field else self.message


class OutputError(FieldError):
    """An output file cannot be written (checked before long work; never left half-written).

    Its ``field`` is the argument naming the output (``output``, ``path``).
    """

    exit_code = 4


class ProblemError(FieldError, ValueError):
    """An argument, a problem, card or schedule file holds a value that is not allowed."""


class StaticMemoryError(ProblemError):
    """Weights, gradients and optimizer state alone overflow a device (field ``hardware``)."""

    def __init__(self, message: str, *, need: float, cap: float) -> None:
        self.need = need
        """Bytes the fullest device holds beside its activations."""
        self.cap = cap
        """Bytes it may hold."""
        super().__init__("hardware", message)


class TimeLimitError(ProblemError):
    """The time limit passed before any schedule was found (raise ``time_limit``)."""

    exit_code = 3


class Interrupted(PPOptError):
    """A signal (Ctrl-C, SIGTERM) ended the run before any schedule was found."""

    exit_code = 130


class NoOrderError(PPOptError):
    """An order generator has no order for this problem: its pattern does not apply, or
    its rule gets stuck under the caps."""

    def __init__(self, generator: str, message: str) -> None:
        self.generator = generator
        super().__init__(f"{generator}: {message}")


class DeadlockError(PPOptError):
    """An op order that can never run: some ops wait on each other."""


class InfeasibleError(PPOptError):
    """A memory cap admits no schedule (or not the one asked for); says the cap that would."""

    exit_code = 2

    def __init__(
        self,
        *,
        device: int,
        need: float,
        cap: float,
        min_cap: float,
        hints: Sequence[str] = (),
        schedule: str | None = None,
        unit: str = "m_b",
    ) -> None:
        self.device = device
        """The device the message is about (the first, or the worst, over its cap)."""
        self.need = need
        """Memory (static plus activations) that device needs."""
        self.cap = cap
        """That device's cap."""
        self.min_cap = min_cap
        """The smallest cap that, given to every device, admits the schedule."""
        self.hints = tuple(hints)
        """Switches that would lower the need: ``offload``, ``recompute``."""
        self.schedule = schedule
        """The named schedule that does not fit, or None for "no schedule at all"."""
        self.unit = unit
        """The unit of the memory numbers: ``m_b`` (activations) or ``bytes``."""
        super().__init__(self.describe())

    def describe(self, name: Callable[[str], str] = _as_is) -> str:
        # The cap printed is rounded up, so giving exactly that number works.
        at_least = memory_text(self.min_cap, self.unit)
        need, cap = amount_text(self.need, self.unit), amount_text(self.cap, self.unit)
        if self.schedule is not None:
            return (
                f"{self.schedule} needs {need} (activation + static) on device {self.device} "
                f"but its cap is {cap}; raise {name('cap')} to at least {at_least}"
            )
        tail = f", or allow {' / '.join(name(h) for h in self.hints)}" if self.hints else ""
        return (
            f"no schedule fits: device {self.device} needs at least {need} but its cap is "
            f"{cap}; raise {name('cap')} to at least {at_least}{tail}"
        )
