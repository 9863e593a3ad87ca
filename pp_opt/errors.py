"""Errors that carry a one-line message for the user: which field, and how to fix it.

Library messages name the Python argument or file field (``cap``, ``time_limit``); the
command line writes its own flags instead (``--cap``, ``--time-limit``) from the
structured fields, so each error says how to fix the input in the caller's terms.
:class:`~pp_opt.validator.ValidationError` lives with the violations it lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def _as_is(name: str) -> str:
    return name


class PPOptError(Exception):
    """Base class of every error pp_opt raises on purpose (the CLI prints it as one line)."""

    exit_code = 1

    def describe(self, name: Callable[[str], str] = _as_is) -> str:
        """The message with argument names spelled by ``name`` (the CLI passes its flags)."""
        return str(self)


class ProblemError(PPOptError, ValueError):
    """An argument, a problem, card or schedule file holds a value that is not allowed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        """The argument or file field at fault (``""`` when it is the whole input)."""
        self.message = message
        """What is wrong and how to fix it."""
        super().__init__(f"{field}: {message}" if field else message)

    def describe(self, name: Callable[[str], str] = _as_is) -> str:
        return f"{name(self.field)}: {self.message}" if self.field else self.message


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
        super().__init__(self.describe())

    def describe(self, name: Callable[[str], str] = _as_is) -> str:
        if self.schedule is not None:
            return (
                f"{self.schedule} needs {self.need:g} (activation + static) on device "
                f"{self.device} but its cap is {self.cap:g}; raise {name('cap')} to at least "
                f"{self.min_cap:g}"
            )
        tail = f", or allow {' / '.join(name(h) for h in self.hints)}" if self.hints else ""
        return (
            f"no schedule fits: device {self.device} needs at least {self.need:g} but its cap "
            f"is {self.cap:g}; raise {name('cap')} to {self.min_cap:g} or more{tail}"
        )
