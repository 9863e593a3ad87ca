"""Stack cards: what a training framework adds to the hardware.

A stack (``torchtitan``, ``megatron-core``, ``automodel``) runs the same model on the same
GPUs with its own kernels, token dispatchers, optimizer layout and memory report. Its card
(``models/stack-<name>.toml``, or a path) says so, each number with its source; a fitted
constant is marked FITTED with the published rows it came from. The job names its stack
(``Job.stack``); the profiler reads the card here.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pp_opt.card_files import card_names, card_text
from pp_opt.errors import ProblemError
from pp_opt.job import DEFAULTS, DISPATCHERS, Job, check_ac
from pp_opt.profiler.context_parallel import CP_ATTENTION

PREFIX = "stack-"
"""Bundled stack cards are ``models/stack-<name>.toml``."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StackCard:
    """A training framework's kernels, dispatchers, optimizer state and memory report."""

    name: str
    """The stack's name (``torchtitan``)."""
    gemm_scale: float = 1.0
    """The stack's GEMM rate over the hardware card's (its kernels on that card)."""
    grouped_gemm_half_tokens: float = 128.0
    """Tokens per local expert at which a grouped expert GEMM runs at half the dense rate."""
    dispatcher: str = "alltoall"
    """The token dispatcher a job gets by default (:data:`pp_opt.job.DISPATCHERS`)."""
    alltoall_efficiency: float = 0.6
    """Fraction of the link bandwidth NCCL's all-to-all dispatch reaches."""
    deepep_efficiency: float = 0.8
    """Fraction of the link bandwidth DeepEP's kernels reach."""
    hybridep_efficiency: float = 0.8
    """Fraction of the link bandwidth HybridEP's kernels reach."""
    allgather_efficiency: float = 0.8
    """Fraction of the link bandwidth the all-gather dispatcher's collectives reach."""
    dispatch_latency_us: float = 30.0
    """Fixed cost of one dispatch or combine (kernel launch, synchronisation)."""
    fp8_dispatch: bool = True
    """Under ``fp8``, DeepEP and HybridEP dispatch FP8 tokens (else the bf16 hidden states go
    on the wire and only the expert GEMMs quantize them)."""
    moe_host_ms: float = 0.0
    """Host (CPU) time to launch one MoE layer's forward (its backward: twice that). Every MoE
    layer's forward waits on the GPU for its token counts (a device-to-host sync), so the
    host cannot run ahead of the GPU there: a pass lasts at least its host time."""
    optimizer: str = "fsdp"
    """``fsdp``: the job's FSDP layout (``dp_shard``) shards the state; ``distributed``:
    Megatron-Core's distributed optimizer shards master weights and moments over the
    data-parallel ranks (experts over the expert data-parallel ones), bf16 weights and
    ``main_grad_bytes`` gradients stay whole."""
    main_grad_bytes: float = 4.0
    """Bytes per gradient the distributed optimizer's buffer keeps (fp32: 4)."""
    master_bytes: float = 4.0
    """Bytes per master weight (fp32: 4)."""
    moment_bytes: float = 8.0
    """Bytes of Adam's two moments per parameter (fp32: 8; bf16 moments: 4)."""
    fsdp_holds_unsharded: bool = True
    """Under a pipeline, FSDP keeps each stage's gathered weights and fp32 gradients from
    its first forward to its last backward (torchtitan); False: it reshards after each
    layer, holding about two layers' worth (prefetch)."""
    fsdp_always: bool = False
    """FSDP2 wraps every job, with one shard or many (torchtitan 0.3.0): a job without FSDP
    degree still keeps fp32 weights, gathers bf16 copies and, under a pipeline, holds them
    and its fp32 gradients across the step, as :mod:`pp_opt.profiler.fsdp` counts for any
    shard degree."""
    keeps_stage_outputs: bool = True
    """The last pipeline stage keeps every microbatch's output (bf16 logits) to the step's end
    (torch pipelining's ``output_chunks``, of Dec 2024); False: the trainer asks for no
    outputs (torchtitan 0.3.0 ``trainer.py``: ``step(..., return_outputs=False)``)."""
    loss_chunks: int = 1
    """The sequence chunks the loss runs in, each chunk's output layer, loss and backward
    inside the last stage's F (torchtitan 0.3.0's ``ChunkedLossWrapper``: 8); 1: the whole
    microbatch's loss after the output layer, its backward in B
    (:mod:`pp_opt.profiler.loss`)."""
    memory_report: str = "reserved"
    """What its published memory means: ``reserved`` (torchtitan) or ``allocated``
    (Megatron-Core, NeMo: ``max allocated``)."""
    overlaps_pairs: bool = False
    """It runs an overlapped F&B pair's halves at once (else in sequence)."""
    pair_overhead: float = 0.0
    """Compute added by sharing the GPU between a pair's halves (a fraction)."""
    ac_modes: tuple[str, ...] = ("none", "selective_op", "full")
    """The activation checkpointing modes it runs, which a plan searches when ``ac`` is not
    pinned (torchtitan 0.3.0: none, ``SelectiveAC``'s op policy and ``FullAC``)."""
    cp_attention: str = "ring"
    """How attention runs under context parallelism
    (:data:`pp_opt.profiler.context_parallel.CP_ATTENTION`): ``ring`` (torch's SDPA ring,
    torchtitan 9dec370) or ``gathered`` (keys and values all-gathered before one kernel,
    torchtitan 0.3.0's FlexAttention)."""
    cp_kv_width: str = "kv"
    """What context parallelism's ring passes around: ``kv`` the key/value heads, ``query``
    the query heads (torchtitan: torch's ring gets SDPA's inputs after ``repeat_kv``)."""
    cp_grad_bytes: float = 4.0
    """Bytes per element of the key/value gradients the ring passes (torch: fp32)."""
    cp_serialized_when_compiled: bool = False
    """Under torch.compile the ring's collectives are waited as soon as issued (torch's
    functional collectives when traced), so none hides behind attention."""
    attention_kernel: str = ""
    """The fused attention kernel it runs (``flash2``: PyTorch SDPA's flash backend;
    ``cudnn``: Transformer Engine's fused attention), timed at the hardware card's rates for
    it where the card lists them (:mod:`pp_opt.profiler.attention_kernels`)."""
    experts_within_shard: bool = False
    """Expert parallelism borrows its ranks from the FSDP shard group (``dp_shard x cp x
    tp``, torchtitan 0.3.0), not from every data-parallel rank (``dp x cp x tp``)."""
    plain_dp_experts: bool = True
    """It runs expert parallelism under plain data parallelism (``dp_shard`` 1, ``dp`` > 1);
    NeMo AutoModel does not: its FSDP2 mesh refuses pure replication and its DDP strategy
    refuses expert parallelism."""
    note: str = ""
    """What the release does not do yet (printed with a plan for this stack)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(f.default, float) and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < 0
            ):
                raise ProblemError(f"stack.{f.name}", f"got {value!r}; expected a number >= 0")
        if self.dispatcher not in DISPATCHERS:
            raise ProblemError("stack.dispatcher", f"use one of {', '.join(DISPATCHERS)}")
        if self.optimizer not in ("fsdp", "distributed"):
            raise ProblemError("stack.optimizer", "use fsdp or distributed")
        if self.memory_report not in ("reserved", "allocated"):
            raise ProblemError("stack.memory_report", "use reserved or allocated")
        chunks = self.loss_chunks
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ProblemError("stack.loss_chunks", f"got {chunks!r}; give an integer >= 1")
        if self.cp_attention not in CP_ATTENTION:
            raise ProblemError("stack.cp_attention", f"use one of {', '.join(CP_ATTENTION)}")
        if self.cp_kv_width not in ("kv", "query"):
            raise ProblemError("stack.cp_kv_width", "use kv or query")
        for key in ("overlaps_pairs", "fsdp_holds_unsharded", "fsdp_always",
                    "keeps_stage_outputs", "cp_serialized_when_compiled",
                    "fp8_dispatch", "experts_within_shard", "plain_dp_experts"):  # fmt: skip
            if not isinstance(getattr(self, key), bool):
                raise ProblemError(f"stack.{key}", "expected true or false")
        self._check_ac_modes()

    def _check_ac_modes(self) -> None:
        modes = self.ac_modes
        if isinstance(modes, str) or not isinstance(modes, list | tuple) or not modes:
            raise ProblemError("stack.ac_modes", f"got {modes!r:.60}; give a list of modes")
        for mode in modes:
            try:
                check_ac(mode)
            except ProblemError as err:
                raise ProblemError("stack.ac_modes", err.message) from None
        object.__setattr__(self, "ac_modes", tuple(modes))

    def dispatch_efficiency(self, dispatcher: str) -> float:
        """Fraction of the link bandwidth ``dispatcher`` reaches on this stack."""
        return float(getattr(self, f"{dispatcher}_efficiency"))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def stack_names() -> list[str]:
    """The bundled stacks."""
    return [n.removeprefix(PREFIX) for n in card_names() if n.startswith(PREFIX)]


@functools.lru_cache(maxsize=32)
def load_stack_card(where: str) -> StackCard:
    """A stack card by bundled name (``torchtitan``) or path; every key checked."""
    if not isinstance(where, str):
        raise ProblemError("stack", f"got {where!r}; give a stack name or a .toml path")
    path = Path(where)
    if where.endswith(".toml") and path.is_file():
        text, name = path.read_text(encoding="utf-8"), path.stem.removeprefix(PREFIX)
    else:
        text = card_text(PREFIX + where) or ""
        name = where
        if not text:
            raise ProblemError(
                "stack", f"{where}: no such stack; use one of {', '.join(stack_names())} "
                "or a .toml path",
            )  # fmt: skip
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ProblemError("stack", f"{where}: not valid TOML ({err})") from None
    allowed = [f.name for f in fields(StackCard)]
    for key in data:
        if key not in allowed:
            raise ProblemError(
                f"stack.{key}", f"unknown key; allowed keys are {', '.join(allowed)}"
            )
    return StackCard(**{"name": name, **data})


def named_stack(job_fields: dict[str, Any]) -> StackCard:
    """The stack card a job's fields name (the Job's default stack where they name none)."""
    return load_stack_card(job_fields.get("stack", DEFAULTS["stack"]))


def expert_ranks(card: StackCard, *, dp: int, dp_shard: int) -> int:
    """The data-parallel ranks expert parallelism may borrow on ``card``'s stack: the FSDP
    shard group's where it borrows only those (:attr:`StackCard.experts_within_shard`),
    else all of them; none (0) where it runs no experts under plain data parallelism."""
    if dp_shard == 1 < dp and not card.plain_dp_experts:
        return 0
    return dp_shard if card.experts_within_shard else dp


def check_expert_layout(job: Job) -> None:
    """Refuse an expert layout the job's stack cannot run (a one-line error naming ``ep`` or
    ``dp_shard``): the Job's own rule counts every data-parallel rank."""
    if job.ep * job.etp == 1:
        return
    card = load_stack_card(job.stack)
    dp = expert_ranks(card, dp=job.dp, dp_shard=job.dp_shard)
    if dp == 0:
        raise ProblemError(
            "dp_shard", f"the {card.name} stack runs no expert parallelism under plain data "
            "parallelism; give dp_shard > 1",
        )  # fmt: skip
    ranks = dp * job.cp * job.tp
    if ranks % (job.ep * job.etp):
        group = "dp_shard" if card.experts_within_shard else "dp"
        raise ProblemError(
            "ep", f"the {card.name} stack's experts borrow {group} x cp x tp = {ranks} ranks; "
            "give an ep x etp that divides it",
        )  # fmt: skip
