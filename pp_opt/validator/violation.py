"""What the validator reports: one :class:`Violation` per broken rule instance."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pp_opt.errors import PPOptError
from pp_opt.ops import OpKey


def _as_is(name: str) -> str:
    return name


RULES: dict[str, str] = {
    "duplicate": "an op appears more than once",
    "unknown_op": "an op that is not part of the problem (or of the schedule's op variant)",
    "missing": "a required op (F, B/BW, W) is absent",
    "stream": "an op is listed on another stream than the one its kind runs on",
    "duration": "end - start differs from the op's cost (pp_opt.ops.duration, or "
    "pp_opt.ops.pair_time for a pair)",
    "pair": "an overlapped pair FB whose backward half is not a B or BW on the F half's device",
    "start": "an op starts before time 0 (or at a time that is not a finite number)",
    "fraction": "an offload fraction outside (0, 1], or a fraction on an op that moves nothing",
    "dependency": "an op starts before a DAG predecessor's end plus the edge latency",
    "stream_overlap": "two ops overlap on one (device, stream)",
    "link_overlap": "copies in one direction overlap on a host link shared by several devices",
    "memory": "static + activation memory exceeds the device's cap",
    "offload_pairing": "OFFLOAD and RELOAD of one activation are not a pair of equal fraction",
    "offload_disabled": "OFFLOAD/RELOAD ops in a problem that does not allow offload",
    "recompute_disabled": "R ops in a problem that does not allow recompute",
    "split_disabled": "B and W ops in a problem whose backward is fused (split_backward off)",
    "offload_and_recompute": "one activation is both offloaded and recomputed",
    "offload_window": "an OFFLOAD outside the window from its F's end to its backward's start",
    "runtime_order": "the last stage's forwards are not in microbatch order, which PyTorch's "
    "pipeline runtime needs (pp_opt.runtime_rules)",
    "metrics": "the schedule's stored metrics disagree with what its ops imply",
    "lower_bound": "the stored lower bound is above the schedule's own objective",
}
"""Every rule name the validator uses, with what it means."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Violation:
    """One broken rule: which rule, where (op and device), and by how much.

    ``amount`` is in the unit of what is broken: time for timing rules, memory
    for ``memory`` and offload rules, the size of the difference for
    ``metrics``, and a count of ops for ``duplicate``, ``unknown_op`` and
    ``missing`` (so a list of violations can be ranked or summed per rule).
    """

    rule: str
    """A key of :data:`RULES`."""
    message: str
    """What is wrong and what the numbers are, in one sentence."""
    op: OpKey | None = None
    """The op that breaks the rule (for two ops in conflict, the later one)."""
    device: int | None = None
    """The device the op runs on, or the device whose memory or metrics are wrong."""
    amount: float = 0.0
    """By how much the rule is broken (see the class docstring for units)."""

    def __str__(self) -> str:
        where = "schedule"
        if self.op is not None:
            where = str(self.op)
            if self.device is not None:
                where += f" on device {self.device}"
        elif self.device is not None:
            where = f"device {self.device}"
        return f"{where}: {self.rule} broken by {self.amount:.6g}: {self.message}"


class ValidationError(PPOptError):
    """A schedule broke a rule of docs/design.md; ``violations`` lists each one.

    ``action`` (``export``, ``save``, ``show``) is set when the error refuses to hand the
    schedule out; the message then says how to do it anyway (``force``).
    """

    def __init__(self, violations: Sequence[Violation], *, action: str | None = None) -> None:
        self.violations = list(violations)
        self.action = action
        super().__init__(self.describe())

    def describe(self, name: Callable[[str], str] = _as_is) -> str:
        first = self.violations[0] if self.violations else "no violation listed"
        count = len(self.violations)
        more = f" (and {count - 1} more)" if count > 1 else ""
        text = f"invalid schedule: {first}{more}"
        if self.action:
            text += f"; refusing to {self.action} it ({name('force')} to {self.action} anyway)"
        return text
