"""What a plan searches over: the inputs of one training job, and a candidate (a job plus
its search-only switches)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.job import Job
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
        """A total order for deterministic tie-breaking."""
        j = self.job
        return (j.tp, j.pp, j.v, j.placement, j.mbs, self.recompute, self.offload,
                j.optimizer_sharding, j.layers, j.cp, j.dp_shard, j.activation_checkpoint,
                j.fp8, j.compile, j.async_tp)  # fmt: skip

    def label(self) -> str:
        flags = [f for f, on in (("recompute", self.recompute), ("offload", self.offload),
                                 ("sharded", self.job.optimizer_sharding)) if on]  # fmt: skip
        return self.job.label() + "".join(f" {f}" for f in flags)

    def to_dict(self) -> dict[str, Any]:
        """The ``config`` object of a plan file."""
        j = self.job
        return {"tp": j.tp, "pp": j.pp, "dp": j.dp, "v": j.v, "placement": j.placement,
                "mbs": j.mbs, "m": j.microbatches, "recompute": self.recompute,
                "offload": self.offload, "optimizer_sharding": j.optimizer_sharding,
                "layers": list(j.layers), **_features(j)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, seq: int) -> Candidate:
        """Inverse of :meth:`to_dict` (``seq``: the plan's sequence length)."""
        job = Job(tp=data["tp"], pp=data["pp"], dp=data["dp"], v=data["v"],
                  placement=data["placement"], mbs=data["mbs"], microbatches=data["m"], seq=seq,
                  layers=tuple(data["layers"]),
                  optimizer_sharding=data["optimizer_sharding"],
                  **{k: data[k] for k in FEATURE_DEFAULTS if k in data})  # fmt: skip
        return cls(job=job, recompute=data["recompute"], offload=data["offload"])


FEATURE_DEFAULTS: dict[str, Any] = {
    "cp": 1, "dp_shard": 1, "activation_checkpoint": "none", "fp8": False,
    "fp8_all_gather": False, "compile": False, "async_tp": False,
}  # fmt: skip
"""Job fields of issue 27 a plan file's ``config`` carries when they differ from these."""


def _features(job: Job) -> dict[str, Any]:
    return {k: getattr(job, k) for k, d in FEATURE_DEFAULTS.items() if getattr(job, k) != d}


@dataclass(kw_only=True, slots=True)
class Pins:
    """Values a user pinned; None searches every legal value of that dimension."""

    tp: tuple[int, ...] | None = None
    """Tensor-parallel degrees to try."""
    pp: tuple[int, ...] | None = None
    """Pipeline sizes to try."""
    v: tuple[int, ...] | None = None
    """Chunks per device to try (the ``v`` placement always has 2)."""
    placement: tuple[str, ...] | None = None
    """Placements to try (``loop``, ``v``)."""
    mbs: tuple[int, ...] | None = None
    """Microbatch sizes to try."""
    recompute: bool | None = None
    """Recompute allowed (True), not (False), or both tried (None)."""
    offload: bool | None = None
    """Offload allowed (True), not (False), or both tried (None)."""
    optimizer_sharding: bool | None = None
    """Optimizer sharding on, off, or both tried (None; off when ``dp = 1``)."""
    ac: tuple[str, ...] | None = None
    """Activation checkpointing modes to try (None: ``none``)."""
    cp: tuple[int, ...] | None = None
    """Context-parallel degrees to try (None: 1)."""
    dp_shard: tuple[int, ...] | None = None
    """FSDP shard degrees to try, each dividing ``dp`` (None: 1, plain data parallelism)."""
    fp8: bool = False
    """Float8 linear layers allowed (then used)."""
    compile: bool = False
    """torch.compile allowed (then used)."""
    async_tp: bool = False
    """AsyncTP allowed (then used where ``tp > 1``; needs ``compile``)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}
