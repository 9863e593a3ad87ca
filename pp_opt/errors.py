"""Errors that carry a one-line message for the user: which field, and how to fix it."""

from __future__ import annotations


class PPOptError(Exception):
    """Base class of every error pp_opt raises on purpose (the CLI prints it as one line)."""

    exit_code = 1


class ProblemError(PPOptError, ValueError):
    """A problem, card or schedule file holds a value that is not allowed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class DeadlockError(PPOptError):
    """An op order that can never run: some ops wait on each other."""


class InfeasibleError(PPOptError):
    """No schedule fits the memory caps; carries the smallest cap that would."""

    exit_code = 2

    def __init__(self, message: str, *, min_cap: float | None = None) -> None:
        self.min_cap = min_cap
        super().__init__(message)


class ValidationError(PPOptError):
    """A schedule broke a rule of DESIGN.md; ``violations`` lists each one."""

    def __init__(self, violations: list) -> None:  # list[Violation], kept loose to avoid a cycle
        self.violations = violations
        head = "; ".join(str(v) for v in violations[:3])
        more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
        super().__init__(f"invalid schedule: {head}{more}")
