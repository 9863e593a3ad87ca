"""What a plan searches over: the inputs of one training job, and a candidate (a job plus
its search-only switches)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.job import DEFAULTS, RENAMED, Job, job_options
from pp_opt.profiler.cards import HardwareCard, ModelCard


@dataclass(kw_only=True, slots=True, frozen=True)
class PlanInputs:
    """One training job: the model, the GPUs and the batch (docs/design.md §8)."""

    model: ModelCard
    """The model card."""
    hardware: HardwareCard
    """The hardware card of every GPU."""
    gpus: int
    """GPUs in the job (``tp x pp x dp``)."""
    global_batch: int
    """Sequences per optimizer step."""
    seq: int
    """Sequence length."""

    def __post_init__(self) -> None:
        for name in ("gpus", "global_batch", "seq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProblemError(name, f"got {value!r}; expected an integer >= 1")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "hardware": self.hardware.name,
            "gpus": self.gpus,
            "global_batch": self.global_batch,
            "seq": self.seq,
        }


@dataclass(kw_only=True, slots=True, frozen=True)
class Candidate:
    """A job plus what only the search decides: what one schedule is solved for.

    Before the split (step 2) ``job.layers`` is empty; a candidate to solve has them.
    """

    job: Job
    """The configuration: degrees, chunks, microbatching, optimizer sharding, layer split."""
    recompute: bool
    """Recomputing a forward is allowed (the solver decides per activation)."""
    offload: bool
    """Offloading activations to host memory is allowed (the solver decides)."""
    origin: str = "split"
    """Where the split came from (``split``: the planner's split model; a baseline's name)."""

    @property
    def layers(self) -> tuple[int, ...]:
        """Decoder layers per stage (the job's)."""
        return self.job.layers

    def key(self) -> tuple[Any, ...]:
        """A total order for deterministic tie-breaking: the degrees, the switches, then
        every other job field in declaration order."""
        j = self.job
        head = (j.tp, j.pp, j.v, j.placement, j.mbs, self.recompute, self.offload,
                j.optimizer_sharding, j.layers)  # fmt: skip
        rest = tuple(getattr(j, name) for name in KEYED if name not in _KEY_HEAD)
        return head + rest

    def label(self) -> str:
        flags = [f for f, on in (("recompute", self.recompute), ("offload", self.offload),
                                 ("sharded", self.job.optimizer_sharding)) if on]  # fmt: skip
        return self.job.label() + "".join(f" {f}" for f in flags)

    def to_dict(self) -> dict[str, Any]:
        """The ``config`` object of a plan file: the job's fields (``m`` its microbatches),
        and the search's switches."""
        fields = self.job.fields_dict()
        fields.pop("seq")
        m = fields.pop("microbatches")
        return {**fields, "m": m, "recompute": self.recompute, "offload": self.offload}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, seq: int) -> Candidate:
        """Inverse of :meth:`to_dict` (``seq``: the plan's sequence length)."""
        fields = {k: v for k, v in data.items() if k not in ("recompute", "offload", "m")}
        job = Job.from_dict(fields, seq=seq, microbatches=data["m"])
        return cls(job=job, recompute=data["recompute"], offload=data["offload"])


_KEY_HEAD = ("tp", "pp", "v", "placement", "mbs", "optimizer_sharding", "layers")
KEYED = tuple(name for name, default in DEFAULTS.items()
              if default is not None and default is not MISSING)  # fmt: skip
"""Job fields that order candidates (those that are never None)."""


class Pins:
    """Values a user pinned; None searches every legal value of that dimension.

    Besides ``recompute`` and ``offload`` (the search's own switches), every :class:`Job`
    field the ``plan`` command takes is a pin (:func:`pp_opt.job.job_options`), by its
    :attr:`JobOption.plan <pp_opt.job.JobOption.plan>`: ``values`` fields take a tuple of
    values to try (None: the planner's range), ``both`` a bool or None (try both), ``allow``
    a bool (allowed, then used), ``fixed`` one value for every candidate.
    """

    __slots__ = ("recompute", "offload", "values")

    def __init__(self, *, recompute: bool | None = None, offload: bool | None = None,
                 **pinned: Any) -> None:  # fmt: skip
        self.recompute = recompute
        """Recompute allowed (True), not (False), or both tried (None)."""
        self.offload = offload
        """Offload allowed (True), not (False), or both tried (None)."""
        self.values: dict[str, Any] = {name: pin_default(name) for name in PINNED}
        """Each job field's pin."""
        for name, value in pinned.items():
            key = RENAMED.get(name, name)
            if key not in PINNED:
                raise ProblemError(name, f"not a plan setting; use one of {', '.join(PINNED)}")
            self.values[key] = _pin(key, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return object.__getattribute__(self, "values")[RENAMED.get(name, name)]
        except KeyError:
            raise AttributeError(name) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pins) and self.to_dict() == other.to_dict()

    def to_dict(self) -> dict[str, Any]:
        out = {"recompute": self.recompute, "offload": self.offload, **self.values}
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


PINNED = job_options("plan")
"""The job fields a plan pins, by name."""


def pin_default(name: str) -> Any:
    """An unpinned field's pin: None (searched), False (not allowed) or the job default."""
    plan = PINNED[name].plan
    if plan == "allow":
        return False
    return DEFAULTS[name] if plan == "fixed" else None


def _pin(name: str, value: Any) -> Any:
    """``value`` as the pin of ``name``: a tuple of values for ``values`` fields."""
    spec = PINNED[name]
    if spec.plan == "values" and value is not None:
        if isinstance(value, str) or not isinstance(value, tuple | list):
            value = (value,)
        return tuple(value)
    return value
