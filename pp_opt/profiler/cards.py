"""Model and hardware cards: small TOML files that describe a decoder model and a GPU node.

The bundled cards are package data (:mod:`pp_opt.card_files`, sources in ``models/``); each number
there cites its source. A card is loaded by path or by bundled name (``"llama2-7b"`` finds
``models/llama2-7b.toml``, shipped in the wheel as ``pp_opt/card_files/llama2-7b.toml``), and every
key is checked, so a typo fails at once instead of silently using a default.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from pp_opt.arguments import integer
from pp_opt.card_files import card_infos, card_names, card_text
from pp_opt.errors import ProblemError
from pp_opt.limits import MAX_VALUE
from pp_opt.profiler.attention_kernels import AttentionRates, attention_table

_MAX_INT = int(MAX_VALUE)
"""Largest integer a card field takes."""

Card = TypeVar("Card", "ModelCard", "HardwareCard")

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
GIB = 1024**3
GB = 1e9


MOE_FIELDS = ("experts", "top_k", "shared_experts", "moe_ffn", "dense_layers", "node_limit")
"""A model card's Mixture-of-Experts keys."""
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""A model card's multi-head latent attention keys."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelCard:
    """Shape of a transformer decoder: enough to count its FLOPs, bytes and parameters."""

    name: str
    """A label, usually the file stem."""
    layers: int
    """Number of decoder layers."""
    hidden: int
    """Hidden size ``h``."""
    heads: int
    """Attention (query) heads ``a``."""
    kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means ``heads``."""
    ffn: int = 0
    """MLP inner size ``f``; 0 means ``4h``."""
    vocab: int
    """Vocabulary size (padded as the training framework pads it)."""
    seq: int
    """Default sequence length ``s``."""
    mlp: str = "gelu"
    """``gelu`` (two matrices) or ``swiglu`` (gate, up and down matrices)."""
    norm: str = "layernorm"
    """``layernorm`` or ``rmsnorm``."""
    attention: str = "eager"
    """``eager`` keeps the ``a s x s`` score matrix for backward; ``flash`` is a fused kernel."""
    dropout: float = 0.0
    """Dropout probability after attention scores, attention output and MLP (0 = no dropout)."""
    dtype: str = "bf16"
    """Activation and parameter dtype: ``bf16``, ``fp16`` or ``fp32``."""
    bias: bool = True
    """Linear layers carry biases."""
    position: str = "learned"
    """``learned`` position embeddings (``s x h`` table) or ``rope`` (no parameters)."""
    head_dim: int = 0
    """Width of one attention head; 0 means ``hidden / heads`` (Qwen3 and GPT-OSS differ)."""
    experts: int = 0
    """Routed experts of each MoE layer; 0: a dense model (every field below unused)."""
    top_k: int = 0
    """Routed experts each token goes to."""
    shared_experts: int = 0
    """Experts every token goes to besides the routed ones (DeepSeek's shared expert)."""
    moe_ffn: int = 0
    """Inner size of one routed (and one shared) expert's SwiGLU MLP."""
    dense_layers: int = 0
    """The first layers whose MLP is dense (``ffn`` wide; DeepSeek's ``first_k_dense_replace``)."""
    node_limit: int = 0
    """Nodes a token's routed experts may span (DeepSeek's ``topk_group``); 0: no limit."""
    q_lora_rank: int = 0
    """Multi-head latent attention (MLA): the query's compressed width (0: no compression)."""
    kv_lora_rank: int = 0
    """MLA: the keys' and values' compressed width; 0: not MLA."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key width without rotary positions."""
    qk_rope_head_dim: int = 0
    """MLA: per-head query/key width with rotary positions (the key's part is shared)."""
    v_head_dim: int = 0
    """MLA: per-head value width."""
    mtp_layers: int = 0
    """Multi-token prediction modules after the last layer (one layer each, on the last stage)."""
    sliding_window: int = 0
    """Tokens a sliding-window attention layer sees; 0: every layer attends in full."""
    window_every: int = 0
    """Every this many layers one attends in full, the others in the window (GPT-OSS: 2)."""
    attention_sinks: bool = False
    """A learned sink logit per head (GPT-OSS): parameters and FLOPs too small to count."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ProblemError("model.name", f"got {self.name!r}; expected a string")
        self._check_moe()
        if not isinstance(self.bias, bool):
            raise ProblemError("model.bias", f"got {self.bias!r}; expected true or false")
        for key in ("layers", "hidden", "heads", "vocab", "seq"):
            integer(f"model.{key}", getattr(self, key), low=1, high=_MAX_INT)
        for key in ("kv_heads", "ffn"):
            integer(f"model.{key}", getattr(self, key), low=0)
        if self.hidden % self.heads and not self.head_dim and not self.mla:
            raise ProblemError("model.heads", f"{self.heads} does not divide hidden {self.hidden}")
        if self.heads % self.num_kv_heads:
            raise ProblemError(
                "model.kv_heads", f"{self.num_kv_heads} does not divide heads {self.heads}"
            )
        _choice("model.mlp", self.mlp, ("gelu", "swiglu"))
        _choice("model.norm", self.norm, ("layernorm", "rmsnorm"))
        _choice("model.attention", self.attention, ("eager", "flash"))
        _choice("model.dtype", self.dtype, tuple(DTYPE_BYTES))
        _choice("model.position", self.position, ("learned", "rope"))
        if (
            isinstance(self.dropout, bool)
            or not isinstance(self.dropout, int | float)
            or not 0.0 <= self.dropout < 1.0
        ):
            raise ProblemError("model.dropout", f"got {self.dropout!r}; expected 0 <= dropout < 1")

    def _check_moe(self) -> None:
        """An MoE card names every MoE field; an MLA card every MLA width."""
        for key in MOE_FIELDS + MLA_FIELDS + ("head_dim", "mtp_layers", "sliding_window",
                                              "window_every"):  # fmt: skip
            integer(f"model.{key}", getattr(self, key), low=0, high=_MAX_INT)
        if not isinstance(self.attention_sinks, bool):
            raise ProblemError("model.attention_sinks", "expected true or false")
        if self.experts:
            for key in ("top_k", "moe_ffn"):
                if not getattr(self, key):
                    raise ProblemError(
                        f"model.{key}", "missing; an MoE card (experts > 0) needs it"
                    )
            if self.top_k > self.experts:
                raise ProblemError("model.top_k", f"{self.top_k} above the {self.experts} experts")
            if self.dense_layers > self.layers:
                raise ProblemError("model.dense_layers", f"above the {self.layers} layers")
        elif any(getattr(self, key) for key in MOE_FIELDS[1:]):
            raise ProblemError("model.experts", "missing; MoE fields need the routed experts")
        if self.kv_lora_rank:
            for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if not getattr(self, key):
                    raise ProblemError(
                        f"model.{key}", "missing; an MLA card (kv_lora_rank) needs it"
                    )

    @property
    def moe(self) -> bool:
        """Mixture-of-Experts layers (routed experts)."""
        return self.experts > 0

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2)."""
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """Decoder layers with an MoE MLP."""
        return self.layers - self.dense_layers if self.moe else 0

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) has an MoE MLP."""
        return self.moe and index >= self.dense_layers

    @property
    def attn_head_dim(self) -> int:
        """Width of one (non-MLA) attention head."""
        return self.head_dim or self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv_hidden(self) -> int:
        """Width of the key (or value) projection: ``kv_heads * head_dim``."""
        return self.num_kv_heads * self.attn_head_dim

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True, slots=True, frozen=True)
class HardwareCard:
    """One GPU model in its node: compute, memory, host link and neighbour links."""

    name: str
    """A label, usually the file stem."""
    peak_tflops: float
    """Dense peak of the model's dtype on tensor cores, in 1e12 FLOP/s."""
    gemm_efficiency: float
    """Fraction of the peak large training GEMMs reach."""
    hbm_gib: float
    """GPU memory in GiB."""
    hbm_gbs: float
    """GPU memory bandwidth in GB/s (1e9 bytes/s)."""
    hbm_efficiency: float = 1.0
    """Fraction of the memory bandwidth elementwise kernels reach."""
    d2h_gbs: float
    """Effective device-to-host copy bandwidth (pinned memory), GB/s."""
    h2d_gbs: float
    """Effective host-to-device copy bandwidth (pinned memory), GB/s."""
    gpus_per_node: int = 8
    """GPUs per node (pipeline neighbours beyond it talk over the inter-node network)."""
    gpus_per_host_link: int = 1
    """GPUs that share one host (PCIe) link for offload and reload copies."""
    intra_node_gbs: float
    """Point-to-point bandwidth between GPUs of one node, each way, GB/s."""
    intra_node_latency_us: float = 10.0
    """Latency of one point-to-point message inside a node, microseconds."""
    inter_node_gbs: float
    """Point-to-point bandwidth between nodes per GPU, each way, GB/s."""
    inter_node_latency_us: float = 20.0
    """Latency of one point-to-point message between nodes, microseconds."""
    reserve_gib: float = 4.0
    """Memory kept free of the cap: CUDA context, communication buffers, fragmentation."""
    fp8_peak_tflops: float = 0.0
    """Dense FP8 tensor-core peak, 1e12 FLOP/s (0: no FP8 tensor cores)."""
    fp8_gemm_efficiency: float = 0.0
    """Fraction of the FP8 peak Float8 training GEMMs reach (> 0 when there is an FP8 peak)."""
    pipeline_fragmentation: float = 0.0
    """The caching allocator's reserved-over-allocated bytes per byte that comes and goes
    within a pipelined step (activations, accumulated gradients: freed first in, first out
    between long-lived allocations); a fitted constant where a card sets it
    (:mod:`pp_opt.profiler.memory_breakdown`)."""
    attention: tuple[AttentionRates, ...] = ()
    """Fused attention kernels' measured rates (``[attention.<kernel>]`` tables,
    :mod:`pp_opt.profiler.attention_kernels`); a kernel not listed runs at the GEMM rate."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ProblemError("hardware.name", f"got {self.name!r}; expected a string")
        object.__setattr__(self, "attention", attention_table(self.attention or {}))
        for f in fields(self):
            if f.name in ("name", "attention"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ProblemError(f"hardware.{f.name}", f"got {value!r}; expected a number >= 0")
            if not math.isfinite(value) or value < 0 or value > MAX_VALUE:
                raise ProblemError(
                    f"hardware.{f.name}", f"got {value!r}; expected a finite number >= 0"
                )
        for key in ("peak_tflops", "gemm_efficiency", "hbm_gib", "hbm_gbs", "hbm_efficiency"):
            if getattr(self, key) <= 0:
                raise ProblemError(f"hardware.{key}", "must be greater than 0")
        for key in ("gemm_efficiency", "hbm_efficiency"):
            if getattr(self, key) > 1:
                raise ProblemError(f"hardware.{key}", "is a fraction of the peak; give at most 1")
        for key in ("d2h_gbs", "h2d_gbs", "intra_node_gbs", "inter_node_gbs"):
            if getattr(self, key) <= 0:
                raise ProblemError(f"hardware.{key}", "must be greater than 0 (a bandwidth)")
        for key in ("gpus_per_node", "gpus_per_host_link"):
            integer(f"hardware.{key}", getattr(self, key), low=1, high=_MAX_INT)
        if self.fp8_peak_tflops > 0 and not 0 < self.fp8_gemm_efficiency <= 1:
            raise ProblemError(
                "hardware.fp8_gemm_efficiency", "give a fraction in (0, 1] with fp8_peak_tflops"
            )
        if self.pipeline_fragmentation > 1:
            raise ProblemError("hardware.pipeline_fragmentation", "is a fraction; give 0 to 1")
        if self.reserve_gib >= self.hbm_gib:
            raise ProblemError("hardware.reserve_gib", "must be smaller than hbm_gib")

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def gemm_flops(self) -> float:
        """FLOP/s large training GEMMs reach: the peak times ``gemm_efficiency``."""
        return self.peak_flops * self.gemm_efficiency

    @property
    def cap_bytes(self) -> float:
        """The memory cap a device gets: HBM minus the reserve (a pipelined job's profile
        lowers it by the allocator's fragmentation, :func:`memory_breakdown.cap_bytes`)."""
        return self.usable_bytes

    @property
    def usable_bytes(self) -> float:
        """HBM minus the reserve (reserved bytes)."""
        return (self.hbm_gib - self.reserve_gib) * GIB

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "attention"}
        if self.attention:
            out["attention"] = {r.kernel: r.to_dict() for r in self.attention}
        return out


def _choice(field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ProblemError(field, f"unknown {value!r}; use one of {', '.join(allowed)}")


def _card_from(kind: str, cls: type[Card], data: Mapping[str, Any], default_name: str) -> Card:
    allowed = [f.name for f in fields(cls)]
    for key in data:
        if key not in allowed:
            raise ProblemError(
                f"{kind}.{key}", f"unknown key; allowed keys are {', '.join(allowed)}"
            )
    required = [
        f.name
        for f in fields(cls)
        if f.name != "name" and f.default is f.default_factory  # both MISSING: required
    ]
    missing = [key for key in required if key not in data]
    if missing:
        raise ProblemError(
            f"{kind}.{missing[0]}", f"missing; a {kind} card needs {', '.join(required)}"
        )
    return cls(**{"name": default_name, **data})


def _read_card(kind: str, where: str | Path) -> tuple[dict[str, Any], str]:
    """A card's keys and name: from a file at ``where``, else the bundled card of that name."""
    if not isinstance(where, str | Path):
        raise ProblemError(kind, f"got {type(where).__name__}; give a card path or name")
    path = Path(where)
    if path.is_file():
        from pp_opt.problem_io import read_text

        text, stem = read_text(path, f"{kind} card .toml"), path.stem
    else:
        bundled = card_text(str(where)) if isinstance(where, str) else None
        if bundled is None:
            names = ", ".join(card_names())
            raise ProblemError(
                kind, f"{where}: no such card file; give a .toml path or one of {names}"
            )
        text, stem = bundled, str(where)
    try:
        return tomllib.loads(text), stem
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise ProblemError(kind, f"{where}: not valid TOML ({err})") from None


def model_card_from_dict(data: Mapping[str, Any], name: str = "model") -> ModelCard:
    """Check a model card given as a dict (the TOML keys)."""
    return _card_from("model", ModelCard, data, name)


def hardware_card_from_dict(data: Mapping[str, Any], name: str = "hardware") -> HardwareCard:
    """Check a hardware card given as a dict (the TOML keys)."""
    return _card_from("hardware", HardwareCard, data, name)


def load_model_card(where: str | Path | ModelCard) -> ModelCard:
    """Load a model card from a TOML path or a bundled name (:mod:`pp_opt.card_files`)."""
    if isinstance(where, ModelCard):
        return where
    data, stem = _read_card("model", where)
    return model_card_from_dict(data, stem)


def load_hardware_card(where: str | Path | HardwareCard) -> HardwareCard:
    """Load a hardware card from a TOML path or a bundled name (:mod:`pp_opt.card_files`)."""
    if isinstance(where, HardwareCard):
        return where
    data, stem = _read_card("hardware", where)
    return hardware_card_from_dict(data, stem)


def bundled_cards() -> dict[str, list[str]]:
    """Names of the bundled model and hardware cards (hardware cards have ``peak_tflops``)."""
    out: dict[str, list[str]] = {"model": [], "hardware": [], "stack": []}
    for info in card_infos():
        out[info.kind].append(info.name)
    return out
