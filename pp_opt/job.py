"""One training job's parallel layout and settings: what a cost profile is made for.

The profiler, the planner and the command line all describe a configuration with one
:class:`Job` (docs/design.md §8; names follow torchtitan's where it has one). A new
setting is one new field here, with its check in :meth:`Job.__post_init__` and its cost in
the profiler's formulas.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pp_opt.arguments import integer
from pp_opt.errors import ProblemError
from pp_opt.limits import check_size
from pp_opt.placement import stage_devices

ACTIVATION_CHECKPOINT_MODES = ("none", "selective", "selective_op", "full")
"""``none`` keeps every activation; ``selective`` recomputes the attention core in B
(Megatron's ``--recompute-activations``); ``selective_op`` is torchtitan's op-level policy
(every second matmul and all elementwise ops re-run); ``full`` keeps only each layer's input
and re-runs its forward in B (:mod:`pp_opt.profiler.checkpointing`)."""


def microbatch_count(*, global_batch: int, dp: int, mbs: int) -> int:
    """Microbatches per pipeline and step (``m``): the global batch split over ``dp``
    replicas into microbatches of ``mbs`` sequences, which must come out whole."""
    for name, value in (("global_batch", global_batch), ("dp", dp), ("mbs", mbs)):
        integer(name, value, low=1)
    if global_batch % (dp * mbs):
        raise ProblemError(
            "global_batch", f"{global_batch} sequences do not split into whole microbatches "
            f"over dp {dp} x mbs {mbs}; use a multiple of dp x mbs = {dp * mbs}"
        )  # fmt: skip
    return global_batch // (dp * mbs)


@dataclass(kw_only=True, slots=True, frozen=True)
class Job:
    """The parallel layout and training settings of one configuration of a training job.

    One vocabulary for the profiler (:func:`pp_opt.profile_job`), the planner (a candidate
    is a job plus the search's switches), the exporters (torchtitan's fields, Megatron-LM's
    flags) and the command line. Every field is checked when the job is made; an error
    names the field and the fix.
    """

    pp: int
    """Pipeline devices ``p`` (each one tensor-parallel group of ``tp`` GPUs)."""
    microbatches: int
    """Microbatches per pipeline and iteration ``m``."""
    seq: int
    """Sequence length ``s``."""
    tp: int = 1
    """Tensor-parallel degree ``t`` (inside one node, with sequence parallelism)."""
    dp: int = 1
    """Data-parallel replicas (``gpus = tp * pp * dp``)."""
    v: int = 1
    """Chunks (stages) per pipeline device; the ``v`` placement has 2."""
    placement: str = "loop"
    """``loop`` or ``v``."""
    mbs: int = 1
    """Sequences per microbatch ``b``."""
    layers: tuple[int, ...] = ()
    """Decoder layers per stage, in stage order (embedding on the first stage, output layer
    on the last); empty until split (:func:`pp_opt.profiler.layer_split.job_for_card`)."""
    activation_checkpoint: str = "none"
    """Activation checkpointing: one of :data:`ACTIVATION_CHECKPOINT_MODES`."""
    optimizer_sharding: bool = False
    """Optimizer state split over the ``dp`` replicas."""
    bytes_per_param: float | None = None
    """Static bytes per parameter; None: from ``dp`` and ``optimizer_sharding``
    (:func:`pp_opt.profiler.analytic.job_bytes_per_param`; 16 unsharded)."""
    tp_comm: bool = True
    """The tensor-parallel collectives are exposed (added to each layer's F and B when
    ``tp > 1``)."""
    dp_shard: int = 1
    """FSDP shard degree (torchtitan's ``data_parallel_shard_degree``): parameters, gradients
    and optimizer state split over this many GPUs (1: no FSDP)."""
    dp_replicate: int = 0
    """Replicas of each FSDP group (HSDP; torchtitan's ``data_parallel_replicate_degree``);
    0: ``dp / dp_shard``. ``dp = dp_shard * dp_replicate``."""
    cp: int = 1
    """Context-parallel degree (torchtitan's ``context_parallel_degree``): each sequence split
    over ``cp`` GPUs with ring attention (``gpus = tp * pp * cp * dp``)."""
    full_layers: tuple[int, ...] = ()
    """Per stage, how many of its layers are fully checkpointed (Megatron's block method),
    the rest in ``activation_checkpoint``; empty: none (all when that is ``full``)."""
    fp8: bool = False
    """Float8 linear layers (torchtitan's Float8, all block linears; not the output layer)."""
    fp8_all_gather: bool | None = None
    """FSDP all-gathers Float8 weights in FP8 (torchtitan's ``enable_fsdp_float8_all_gather``);
    None: whenever Float8 runs under FSDP (torchtitan's Float8 configurations set it)."""
    compile: bool = False
    """torch.compile of each decoder layer: fused elementwise passes."""
    async_tp: bool = False
    """Tensor-parallel collectives overlapped with their GEMMs (needs ``compile``)."""

    def __post_init__(self) -> None:
        for name in ("pp", "microbatches", "seq", "tp", "dp", "v", "mbs", "dp_shard", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProblemError(name, f"got {value!r}; expected an integer >= 1")
        if self.placement == "v" and self.v == 1:
            object.__setattr__(self, "v", 2)
        check_size(p=self.pp, v=self.v, m=self.microbatches, stages=self.stages)
        stage_devices(self.placement, self.pp, self.v)  # checks placement and v
        if self.activation_checkpoint not in ACTIVATION_CHECKPOINT_MODES:
            modes = " or ".join(ACTIVATION_CHECKPOINT_MODES)
            raise ProblemError(
                "activation_checkpoint", f"unknown {self.activation_checkpoint!r}; use {modes}"
            )
        if self.bytes_per_param is not None:
            bpp = self.bytes_per_param
            if isinstance(bpp, bool) or not isinstance(bpp, int | float) or not 0 <= bpp <= 1024:
                raise ProblemError("bytes_per_param", f"got {bpp!r}; expected 0 to 1024")
        if self.layers and len(self.layers) != self.stages:
            raise ProblemError(
                "layers",
                f"got {len(self.layers)} entries for {self.stages} stages (pp x v); give one each",
            )
        object.__setattr__(self, "layers", tuple(integer("layers", n, low=0) for n in self.layers))
        self._check_data_parallel()
        self._check_features()

    def _check_data_parallel(self) -> None:
        """``dp = dp_shard * dp_replicate``; a job that names only the shard degree gets it."""
        rep = self.dp_replicate
        if isinstance(rep, bool) or not isinstance(rep, int) or rep < 0:
            raise ProblemError("dp_replicate", f"got {rep!r}; expected an integer >= 1")
        if self.dp == 1 and self.dp_shard * max(rep, 1) > 1:
            object.__setattr__(self, "dp", self.dp_shard * max(rep, 1))
        if self.dp % self.dp_shard:
            raise ProblemError(
                "dp_shard", f"{self.dp_shard} does not divide dp {self.dp}; give dp_shard x "
                "dp_replicate = dp",
            )  # fmt: skip
        if rep == 0:
            object.__setattr__(self, "dp_replicate", self.dp // self.dp_shard)
        elif self.dp_shard * rep != self.dp:
            raise ProblemError(
                "dp_replicate",
                f"dp_shard {self.dp_shard} x dp_replicate {rep} != dp {self.dp}; make them agree",
            )
        if self.seq % (2 * self.cp) and self.cp > 1:
            raise ProblemError(
                "cp", f"2 x cp = {2 * self.cp} does not divide seq {self.seq}; use another cp"
            )

    def _check_features(self) -> None:
        if self.fp8_all_gather is None:
            object.__setattr__(self, "fp8_all_gather", self.fp8 and self.dp_shard > 1)
        for name in ("fp8", "fp8_all_gather", "compile", "async_tp", "tp_comm"):
            if not isinstance(getattr(self, name), bool):
                raise ProblemError(name, f"got {getattr(self, name)!r}; expected true or false")
        if self.async_tp and not self.compile:
            raise ProblemError("async_tp", "AsyncTP runs inside compiled layers; add --compile")
        if self.fp8_all_gather and not (self.fp8 and self.dp_shard > 1):
            raise ProblemError("fp8_all_gather", "needs --fp8 and FSDP (dp_shard > 1)")
        full = tuple(int(n) for n in self.full_layers)
        object.__setattr__(self, "full_layers", full)
        if full and len(full) != self.stages:
            raise ProblemError(
                "full_layers", f"got {len(full)} entries for {self.stages} stages; give one each"
            )
        for s, n in enumerate(full):
            most = self.layers[s] if self.layers else n
            if not 0 <= n <= most:
                raise ProblemError(
                    "full_layers", f"stage {s}: {n} of {most} layers; give 0 <= N <= layers"
                )

    @property
    def stages(self) -> int:
        """Pipeline stages, ``pp * v``."""
        return self.pp * self.v

    @property
    def m(self) -> int:
        """``microbatches`` (``m`` in docs/design.md)."""
        return self.microbatches

    @property
    def global_batch(self) -> int:
        """Sequences per step: ``microbatches`` of ``mbs`` on each of the ``dp`` replicas
        (the inverse of :func:`microbatch_count`)."""
        return self.microbatches * self.mbs * self.dp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def fsdp(self) -> bool:
        """Parameters, gradients and optimizer state sharded FSDP-style (``dp_shard > 1``)."""
        return self.dp_shard > 1

    def stage_full_layers(self, stage: int) -> int:
        """Fully checkpointed layers of ``stage`` (all under ``full``)."""
        if self.activation_checkpoint == "full":
            return self.layers[stage] if self.layers else 0
        return self.full_layers[stage] if self.full_layers else 0

    @property
    def stage_devices(self) -> tuple[int, ...]:
        return stage_devices(self.placement, self.pp, self.v)

    def with_layers(self, layers: tuple[int, ...]) -> Job:
        return replace(self, layers=layers)

    def layout_dict(self, bytes_per_param: float) -> dict[str, Any]:
        """The ``profile.layout`` object of a cost profile file (its keys as they were)."""
        return {
            "pp": self.pp,
            "v": self.v,
            "placement": self.placement,
            "microbatches": self.microbatches,
            "mbs": self.mbs,
            "seq": self.seq,
            "tp": self.tp,
            "layers": list(self.layers),
            "recompute": self.activation_checkpoint,
            "bytes_per_param": float(bytes_per_param),
            **{key: getattr(self, key) for key in _FEATURE_DEFAULTS
               if getattr(self, key) != _FEATURE_DEFAULTS[key] or (key == "fp8_all_gather"
                                                                   and self.fp8)},
        }  # fmt: skip

    @classmethod
    def from_layout_dict(cls, data: dict[str, Any], **more: Any) -> Job:
        """Inverse of :meth:`layout_dict` (``more``: fields the file does not carry)."""
        return cls(
            pp=data["pp"], v=data.get("v", 1), placement=data.get("placement", "loop"),
            microbatches=data["microbatches"], mbs=data.get("mbs", 1), seq=data["seq"],
            tp=data.get("tp", 1), layers=tuple(data.get("layers", ())),
            activation_checkpoint=data.get("recompute", "none"),
            bytes_per_param=data.get("bytes_per_param"),
            **_features(data), **more,
        )  # fmt: skip

    def label(self) -> str:
        extra = "".join(
            f" {name}" for name in ("fp8", "compile", "async_tp") if getattr(self, name)
        )
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        shard = f" fsdp{self.dp_shard}" if self.fsdp else ""
        ac = (
            f" ac-{self.activation_checkpoint}"
            if self.activation_checkpoint in ("selective_op", "full")
            else ""
        )
        return (
            f"tp{self.tp} pp{self.pp}{cp} dp{self.dp}{shard} {self.placement} v{self.v} "
            f"mbs{self.mbs} m{self.microbatches}{ac}{extra}"
        )


def _features(data: dict[str, Any]) -> dict[str, Any]:
    """The feature fields a layout object carries."""
    out: dict[str, Any] = {key: data[key] for key in _FEATURE_DEFAULTS if key in data}
    if "full_layers" in out:
        out["full_layers"] = tuple(out["full_layers"])
    return out


_FEATURE_DEFAULTS: dict[str, Any] = {
    "dp": 1, "dp_shard": 1, "cp": 1, "full_layers": (), "fp8": False,
    "fp8_all_gather": False, "compile": False, "async_tp": False,
}  # fmt: skip
"""Fields a cost profile file carries only when they differ from their defaults (files of
older jobs keep their keys)."""
