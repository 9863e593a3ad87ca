"""One training job's parallel layout and settings: what a cost profile is made for.

The profiler, the planner and the command line all describe a configuration with one
:class:`Job` (docs/design.md §8; names follow torchtitan's where it has one). A field is
declared once here, with its type, default, check, help text and label (:class:`JobOption`
in its metadata); ``Pins``, :func:`pp_opt.planner.predict.predict`, the CLI options of
``predict``, ``plan`` and ``profile`` and the file serialisers derive from these
declarations (:func:`job_options`), so a new setting is one field here plus its cost in the
profiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from pp_opt.arguments import choice, integer, number
from pp_opt.errors import ProblemError
from pp_opt.limits import check_size
from pp_opt.placement import stage_devices

ACTIVATION_CHECKPOINT_MODES = ("none", "selective", "selective_op", "full")
"""``none`` keeps every activation; ``selective`` recomputes the attention core in B
(Megatron's ``--recompute-activations``); ``selective_op`` is torchtitan's op-level policy
(every second matmul and all elementwise ops re-run); ``full`` keeps only each layer's input
and re-runs its forward in B (:mod:`pp_opt.profiler.checkpointing`); ``modules:a,b`` re-runs
Megatron-Core's named modules (``--recompute-modules``, :data:`RECOMPUTE_MODULES`)."""

RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")  # fmt: skip
"""Megatron-Core's ``--recompute-modules`` names (``megatron/core/transformer_config.py``)."""

DISPATCHERS = ("alltoall", "deepep", "hybridep", "allgather")
"""MoE token dispatchers: NCCL all-to-all, DeepEP's and HybridEP's fused kernels, and
Megatron-Core's all-gather dispatcher; "" in a job: the stack's default."""

COMMANDS = ("predict", "plan", "profile")
"""The commands that take job fields as options."""


@dataclass(frozen=True, slots=True)
class JobOption:
    """How a :class:`Job` field is given, checked, searched and shown."""

    help: str
    """One line for ``--help``."""
    low: float | None = None
    """Smallest legal value of a number (integers: an ``int``, not a bool)."""
    choices: tuple[str, ...] = ()
    """Legal values of a string field (empty: any)."""
    commands: tuple[str, ...] = COMMANDS
    """The commands that take it as an option (the Python API takes every field)."""
    plan: str = "values"
    """How ``plan`` treats it: ``values`` (a list of values to try, None: the planner's own
    range), ``both`` (a bool tried both ways unless pinned), ``allow`` (a bool the user
    allows, then used), ``fixed`` (one value for every candidate)."""
    label: str = ""
    """The label's text when the field differs from its default (``{}``: the value)."""
    core: bool = False
    """Written into every layout and plan file (the others only when not at their default)."""
    high: float | None = None
    """Largest legal value of a number (None: no bound)."""
    short: str = ""
    """A one-letter flag beside the long one (``-m``)."""
    negatable: bool = False
    """A switch that also has its ``--no-`` flag on every command."""

    def flag(self, name: str) -> str:
        """The command-line spelling of field ``name``."""
        return "--" + name.replace("_", "-")


def option(default: Any, help: str, **spec: Any) -> Any:
    """A Job field: its default and its :class:`JobOption`."""
    return field(default=default, metadata={"option": JobOption(help=help, **spec)})


def required(help: str, **spec: Any) -> Any:
    """A Job field without a default."""
    return field(metadata={"option": JobOption(help=help, **spec)})


BATCH_SPLIT = ("mbs", "grad_accum")  # what splits a replica's share of the batch


def microbatch_count(*, global_batch: int, dp: int, mbs: int = 1, grad_accum: int = 1) -> int:
    """Microbatches per pipeline schedule (``m``): the global batch split over ``dp``
    replicas and ``grad_accum`` schedules into microbatches of ``mbs`` sequences, whole."""
    for name, value in (("global_batch", global_batch), ("dp", dp), ("mbs", mbs),
                        ("grad_accum", grad_accum)):  # fmt: skip
        integer(name, value, low=1)
    if global_batch % (dp * mbs * grad_accum):
        ga = f" x grad_accum {grad_accum}" if grad_accum > 1 else ""
        raise ProblemError(
            "global_batch", f"{global_batch} sequences do not split into whole microbatches "
            f"over dp {dp} x mbs {mbs}{ga}; use a multiple of dp x mbs{ga and ' x grad_accum'} "
            f"= {dp * mbs * grad_accum}",
        )  # fmt: skip
    return global_batch // (dp * mbs * grad_accum)


@dataclass(kw_only=True, slots=True, frozen=True)
class Job:
    """The parallel layout and training settings of one configuration of a training job.

    One vocabulary for the profiler (:func:`pp_opt.profile_job`), the planner (a candidate
    is a job plus the search's switches), the exporters (torchtitan's fields, Megatron-LM's
    flags) and the command line. Every field is checked when the job is made; an error
    names the field and the fix.
    """

    pp: int = required("Pipeline-parallel degree (1: no pipeline).", low=1, core=True)
    """Pipeline devices ``p`` (each one tensor-parallel group of ``tp`` GPUs)."""
    microbatches: int = required(
        "Microbatches per pipeline and step.",
        low=1,
        commands=("profile",),
        core=True,
        short="-m",
    )
    """Microbatches per pipeline and iteration ``m``."""
    seq: int = required("Sequence length.", low=1, commands=(), core=True)
    """Sequence length ``s``."""
    tp: int = option(1, "Tensor-parallel degree (sequence parallel, inside a node).", low=1,
                     core=True)  # fmt: skip
    """Tensor-parallel degree ``t`` (inside one node, with sequence parallelism)."""
    dp: int = option(1, "Data-parallel replicas.", low=1, commands=(), core=True)
    """Data-parallel replicas (``gpus = tp * pp * cp * dp``)."""
    v: int = option(1, "Stages per pipeline rank (the v placement has 2).", low=1, core=True)
    """Chunks (stages) per pipeline device; the ``v`` placement has 2."""
    placement: str = option("loop", "Stage placement: loop or v.", choices=("loop", "v"),
                            core=True)  # fmt: skip
    """``loop`` or ``v``."""
    mbs: int = option(1, "Sequences per microbatch.", low=1, core=True)
    """Sequences per microbatch ``b``."""
    grad_accum: int = option(1, "Gradient accumulation: pipeline schedules per step (PyTorch "
                             "pipelining's local batch runs this often).", low=1, plan="fixed",
                             commands=("predict", "plan"), label=" ga{}")  # fmt: skip
    """Schedules per step, gradients kept between them (Megatron-LM runs one schedule)."""
    layers: tuple[int, ...] = option(
        (), "Decoder layers per stage, e.g. 2,3,3,2 (default: split).",
        commands=("predict", "profile"), plan="fixed", core=True,
    )  # fmt: skip
    """Decoder layers per stage, in stage order (embedding on the first stage, output layer
    on the last); empty until split (:func:`pp_opt.profiler.layer_split.job_for_card`)."""
    ac: str = option("none", "Activation checkpointing: none, selective, selective_op, full "
                     "or modules:NAME,NAME (Megatron-Core's --recompute-modules).",
                     label=" ac-{}")  # fmt: skip
    """Activation checkpointing: one of :data:`ACTIVATION_CHECKPOINT_MODES`, or
    ``modules:`` and a comma list of :data:`RECOMPUTE_MODULES`."""
    optimizer_sharding: bool = option(
        False, "Shard the optimizer state over dp (plan default: try both).",
        commands=("plan",), plan="both", core=True,
    )  # fmt: skip
    """Optimizer state split over the ``dp`` replicas."""
    bytes_per_param: float | None = option(
        None, "Static bytes per parameter (default: from the sharding).", low=0.0, high=1024.0,
        commands=("profile",), plan="fixed",
    )  # fmt: skip
    """Static bytes per parameter; None: from ``dp`` and ``optimizer_sharding``
    (:func:`pp_opt.profiler.analytic.job_bytes_per_param`; 16 unsharded)."""
    tp_comm: bool = option(True, "Expose the tensor-parallel collectives.", commands=(),
                           plan="fixed")  # fmt: skip
    """The tensor-parallel collectives are exposed (added to each layer's F and B when
    ``tp > 1``)."""
    dp_shard: int = option(1, "FSDP shard degree (1: no FSDP).", low=1, label=" fsdp{}")
    """FSDP shard degree (torchtitan's ``data_parallel_shard_degree``): parameters, gradients
    and optimizer state split over this many GPUs (1: no FSDP)."""
    dp_replicate: int = option(0, "Replicas of each FSDP shard group (0: dp / dp-shard).",
                               low=0, plan="fixed")  # fmt: skip
    """Replicas of each FSDP group (HSDP; torchtitan's ``data_parallel_replicate_degree``);
    0: ``dp / dp_shard``. ``dp = dp_shard * dp_replicate``."""
    cp: int = option(1, "Context-parallel degree (ring attention).", low=1, label=" cp{}")
    """Context-parallel degree (torchtitan's ``context_parallel_degree``): each sequence split
    over ``cp`` GPUs with ring attention (``gpus = tp * pp * cp * dp``)."""
    full_layers: tuple[int, ...] = option(
        (), "Fully checkpointed layers per stage.", commands=(), plan="fixed"
    )
    """Per stage, how many of its layers are fully checkpointed (Megatron's block method),
    the rest in ``ac``; empty: none (all when that is ``full``)."""
    fp8: bool = option(False, "Float8 linear layers.", plan="allow", label=" fp8")
    """Float8 linear layers (torchtitan's Float8, all block linears; not the output layer)."""
    fp8_all_gather: bool | None = option(
        None, "FSDP all-gathers Float8 weights (default: whenever Float8 runs under FSDP).",
        commands=("predict", "profile"), plan="fixed", negatable=True,
    )  # fmt: skip
    """FSDP all-gathers Float8 weights in FP8 (torchtitan's ``enable_fsdp_float8_all_gather``);
    None: whenever Float8 runs under FSDP, sharded over ``dp_shard x cp`` (torchtitan's Float8
    configurations set it)."""
    compile: bool = option(False, "torch.compile each layer.", plan="allow", label=" compile")
    """torch.compile of each decoder layer: fused elementwise passes."""
    async_tp: bool = option(False, "Overlap TP collectives with their GEMMs (needs compile).",
                            plan="allow", label=" async_tp")  # fmt: skip
    """Tensor-parallel collectives overlapped with their GEMMs (needs ``compile``)."""
    ep: int = option(1, "Expert-parallel degree (MoE; borrowed from dp x cp x tp).", low=1,
                     label=" ep{}")  # fmt: skip
    """Expert-parallel degree: each MoE layer's routed experts split over ``ep`` GPUs, borrowed
    from the data-, context- and tensor-parallel ranks of a pipeline stage (Megatron-Core's
    parallel folding; torchtitan's ``expert_parallel_degree``)."""
    etp: int = option(1, "Tensor parallelism inside each expert (MoE).", low=1,
                      label=" etp{}")  # fmt: skip
    """Expert tensor-parallel degree (Megatron-Core's ``--expert-tensor-parallel-size``); the
    expert data-parallel degree is ``dp x cp x tp / (ep x etp)``."""
    dispatcher: str = option("", "MoE token dispatcher: alltoall, deepep, hybridep or "
                             "allgather (default: the stack's).", choices=("", *DISPATCHERS),
                             plan="fixed", label=" {}")  # fmt: skip
    """How tokens reach their experts (:data:`DISPATCHERS`); "": the stack card's default."""
    expert_imbalance: float = option(
        1.0, "Tokens of the busiest expert rank over the mean (1: balanced).", low=1.0,
        plan="fixed", label=" imbalance{}",
    )  # fmt: skip
    """The busiest expert rank's tokens over the mean (published MoE benchmarks force-balance
    the router: 1)."""

    overlap: bool = option(
        False, "Overlap one microbatch's forward with another's backward on a GPU (F&B pairs: "
        "DualPipe, Megatron-Core's --overlap-moe-expert-parallel-comm); the solver decides "
        "which.", plan="allow", negatable=True, label=" overlap",
    )  # fmt: skip
    """The run may overlap F&B pairs (docs/design.md §3), hiding each half's communication
    behind the other's compute where the stack overlaps them."""
    mtp: bool = option(True, "Train the model card's multi-token-prediction modules.",
                       commands=("predict", "profile"), plan="fixed", label=" no-mtp")  # fmt: skip
    """The card's multi-token-prediction modules run (False: trained without them)."""
    stack: str = option("torchtitan", "Training stack: torchtitan, megatron-core, automodel or "
                        "a stack card .toml.", plan="fixed", label=" {}")  # fmt: skip
    """The training framework's stack card (:mod:`pp_opt.profiler.stacks`): its kernels,
    dispatchers, optimizer layout and memory report."""

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_field(f.name, getattr(self, f.name), f.metadata["option"])
        if self.placement == "v" and self.v == 1:
            object.__setattr__(self, "v", 2)
        check_size(p=self.pp, v=self.v, m=self.microbatches, stages=self.stages)
        stage_devices(self.placement, self.pp, self.v)  # checks placement and v
        check_ac(self.ac)
        if self.layers and len(self.layers) != self.stages:
            raise ProblemError(
                "layers",
                f"got {len(self.layers)} entries for {self.stages} stages (pp x v); give one each",
            )
        object.__setattr__(self, "layers", tuple(integer("layers", n, low=0) for n in self.layers))
        self._check_data_parallel()
        self._check_features()
        self._check_experts()

    def _check_data_parallel(self) -> None:
        """``dp = dp_shard * dp_replicate``; a job that names only the shard degree gets it."""
        rep = self.dp_replicate
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
            object.__setattr__(self, "fp8_all_gather", self.fp8 and self.dp_shard * self.cp > 1)
        if self.async_tp and not self.compile:
            raise ProblemError("async_tp", "AsyncTP runs inside compiled layers; add --compile")
        if self.fp8_all_gather and not (self.fp8 and self.dp_shard * self.cp > 1):
            raise ProblemError("fp8_all_gather", "needs --fp8 and FSDP (dp_shard x cp > 1)")
        full = tuple(integer("full_layers", n, low=0) for n in self.full_layers)
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

    def _check_experts(self) -> None:
        """Expert ranks fold over the ``dp x cp x tp`` GPUs of a pipeline stage."""
        ranks = self.dp * self.cp * self.tp
        if ranks % (self.ep * self.etp):
            raise ProblemError(
                "ep", f"ep {self.ep} x etp {self.etp} does not divide the {ranks} GPUs of a "
                "pipeline stage (dp x cp x tp) the experts fold over; use a divisor",
            )  # fmt: skip

    @property
    def stages(self) -> int:
        """Pipeline stages, ``pp * v``."""
        return self.pp * self.v

    @property
    def m(self) -> int:
        """``microbatches`` (the ``m`` of the op model)."""
        return self.microbatches

    @property
    def global_batch(self) -> int:
        """Sequences per step: ``grad_accum`` schedules of ``microbatches`` of ``mbs`` on each
        of the ``dp`` replicas (the inverse of :func:`microbatch_count`)."""
        return self.microbatches * self.mbs * self.dp * self.grad_accum

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def fsdp(self) -> bool:
        """Parameters, gradients and optimizer state sharded FSDP-style (``dp_shard > 1``)."""
        return self.dp_shard > 1

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: the stage's ``dp x cp x tp`` GPUs over ``ep x etp``."""
        return self.dp * self.cp * self.tp // (self.ep * self.etp)

    @property
    def recompute_modules(self) -> tuple[str, ...]:
        """Megatron-Core's recomputed modules under ``ac = modules:...`` (else none)."""
        if not self.ac.startswith("modules:"):
            return ()
        return tuple(x for x in self.ac.removeprefix("modules:").split(",") if x)

    def stage_full_layers(self, stage: int) -> int:
        """Fully checkpointed layers of ``stage`` (all under ``full``)."""
        if self.ac == "full":
            return self.layers[stage] if self.layers else 0
        return self.full_layers[stage] if self.full_layers else 0

    @property
    def stage_devices(self) -> tuple[int, ...]:
        return stage_devices(self.placement, self.pp, self.v)

    def with_layers(self, layers: tuple[int, ...]) -> Job:
        return replace(self, layers=layers)

    def fields_dict(self) -> dict[str, Any]:
        """Every core field, and the others that differ from their defaults (files of jobs
        made before a field existed keep their bytes)."""
        out: dict[str, Any] = {}
        auto = {"dp_replicate": self.dp // self.dp_shard,
                "fp8_all_gather": self.fp8 and self.dp_shard * self.cp > 1}  # fmt: skip
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in auto and value == auto[f.name]:
                continue  # what the field's own default resolves to
            if f.metadata["option"].core or value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], **more: Any) -> Job:
        """Inverse of :meth:`fields_dict`; ``more`` overrides the file (fields it lacks)."""
        values = {
            RENAMED.get(k, k): v
            for k, v in data.items()
            if RENAMED.get(k, k) in FIELDS and not (k in RENAMED and "ac" in data)
        }
        values.update(more)
        for name in ("layers", "full_layers"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    def layout_dict(self, bytes_per_param: float) -> dict[str, Any]:
        """The ``profile.layout`` object of a cost profile file."""
        return {**self.fields_dict(), "bytes_per_param": float(bytes_per_param)}

    @classmethod
    def from_layout_dict(cls, data: dict[str, Any], **more: Any) -> Job:
        """Inverse of :meth:`layout_dict` (``more``: fields the file does not carry)."""
        return cls.from_dict(data, **more)

    def label(self) -> str:
        """A short name: the degrees and microbatching, then each setting off its default."""
        text = (f"tp{self.tp} pp{self.pp} dp{self.dp} {self.placement} v{self.v} "
                f"mbs{self.mbs} m{self.microbatches}")  # fmt: skip
        for f in fields(self):
            spec: JobOption = f.metadata["option"]
            value = getattr(self, f.name)
            if spec.label and value != f.default and f.name != "fp8_all_gather":
                text += spec.label.format(value)
        return text


RENAMED = {"recompute": "ac", "activation_checkpoint": "ac"}
"""Keys of older files and keywords that name a field by its former name."""

FIELDS: dict[str, JobOption] = {f.name: f.metadata["option"] for f in fields(Job)}
"""Every Job field's :class:`JobOption`, in declaration order."""

DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Job)}
"""Every Job field's default (``dataclasses.MISSING`` where it has none)."""

TYPES: dict[str, str] = {f.name: str(f.type) for f in fields(Job)}
"""Every Job field's type, as written (``int``, ``tuple[int, ...]``, ``bool | None``)."""


def job_options(command: str) -> dict[str, JobOption]:
    """The fields ``command`` (``predict``, ``plan``, ``profile``) takes as options."""
    return {name: spec for name, spec in FIELDS.items() if command in spec.commands}


def check_ac(mode: str) -> str:
    """``mode`` when it is a checkpointing mode or a ``modules:`` list of known modules."""
    if isinstance(mode, str) and mode.startswith("modules:"):
        names = [x for x in mode.removeprefix("modules:").split(",") if x]
        bad = [x for x in names if x not in RECOMPUTE_MODULES]
        if bad or not names:
            raise ProblemError(
                "ac", f"unknown recompute module {(bad or [''])[0]!r}; use some of "
                f"{', '.join(RECOMPUTE_MODULES)}",
            )  # fmt: skip
        return mode
    if mode not in ACTIVATION_CHECKPOINT_MODES:
        modes = ", ".join(ACTIVATION_CHECKPOINT_MODES)
        raise ProblemError("ac", f"unknown {mode!r:.60}; use {modes} or modules:NAME,...")
    return mode


def _check_field(name: str, value: Any, spec: JobOption) -> None:
    """The type and range of one field (its relations to others are the Job's checks)."""
    kind = TYPES.get(name, "")
    if value is None and "None" in kind:
        return
    if kind.startswith("int"):
        integer(name, value, low=int(spec.low if spec.low is not None else 0))
    elif kind.startswith("float"):
        number(name, value, low=spec.low, high=spec.high)
    elif kind.startswith("bool") and not isinstance(value, bool):
        raise ProblemError(name, f"got {value!r:.60}; expected true or false")
    elif kind == "str" and spec.choices:
        choice(name, value, spec.choices)
    elif kind == "str" and not isinstance(value, str):
        raise ProblemError(name, f"got {value!r:.60}; expected a string")
    elif kind.startswith("tuple") and (isinstance(value, str | bytes)
                                       or not isinstance(value, tuple | list)):  # fmt: skip
        raise ProblemError(name, f"got {value!r:.60}; give a list of integers, one per stage")
