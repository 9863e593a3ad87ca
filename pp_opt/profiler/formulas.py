"""Per-layer FLOPs, activation bytes and parameters of a decoder layer (docs/design.md §3).

The Zero Bubble paper gives, per plain GPT layer (``h`` hidden, ``s`` sequence, ``b``
microbatch size, ``a`` heads, bf16, dropout, attention that keeps its score matrix):
F ``sbh(24h + 4s)``, B ``sbh(24h + 8s)``, W ``24sbh^2`` FLOPs; ``M_B = sb(34h + 5as)`` and
``M_W = 32sbh`` bytes. This module counts the same things tensor by tensor, so that the
formulas generalise and reduce exactly to the paper's for a plain layer:

* FLOPs: every linear layer costs ``2 * in * out`` per token in F, the same in B (gradient
  w.r.t. its input) and in W (gradient w.r.t. its weight). Attention's ``QK^T`` and ``PV``
  products (``4s^2bh`` in F, twice that in B, nothing in W) have no weights. With GQA the
  QKV projection is ``h x (h + 2 h_kv)``; a SwiGLU MLP has three ``h x f`` matrices.
* ``M_B``: the tensors autograd keeps from F to B: each norm's input (and its fp32
  statistics), each linear's input, the GeLU/SiLU inputs, dropout masks (``mask_bytes``
  each, 1 for a bool mask), and the attention tensors: for ``eager`` attention Q, K, V, the
  softmax output and, with dropout, its mask and output (the ``5as^2b`` term in bf16); for
  ``flash`` attention Q, K, V, the output and the fp32 log-sum-exp (no score matrix). Eager
  attention with GQA keeps K and V expanded to all heads (as ``repeat_kv`` implementations do).
* ``M_W``: what W still needs after B: the input and the output gradient of every linear.
* Selective recompute (Korthikanti et al. 2022) drops the score-matrix tensors from ``M_B`` and
  adds the attention core's forward to B.
* Tensor parallelism of degree ``t`` with sequence parallelism (Megatron's
  ``--sequence-parallel``): every GEMM, every activation and every parameter matrix is split
  ``t`` ways, so all per-GPU numbers here are divided by ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.errors import ProblemError
from pp_opt.profiler.cards import ModelCard

RECOMPUTE_MODES = ("none", "selective")
"""The recompute modes these counts know (the job's other checkpointing modes, ``selective_op``
and ``full``, are :mod:`pp_opt.profiler.checkpointing`'s, built on a ``none`` shape)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LayerShape:
    """One decoder layer as run on one GPU: the model's shape plus the parallel layout."""

    s: int
    """Sequence length."""
    b: int
    """Microbatch size."""
    h: int
    """Hidden size."""
    a: int
    """Attention heads."""
    h_kv: int
    """Key/value projection width (``h`` without GQA)."""
    f: int
    """MLP inner size."""
    gated: bool = False
    """SwiGLU MLP (gate, up and down matrices) instead of GeLU (two matrices)."""
    attention: str = "eager"
    """``eager`` (keeps the score matrix) or ``flash`` (fused kernel)."""
    dropout: bool = False
    """Dropout after scores, attention output and MLP."""
    norm: str = "layernorm"
    """``layernorm`` (keeps mean and rstd) or ``rmsnorm`` (keeps rstd)."""
    dtype_bytes: int = 2
    """Bytes per activation element."""
    mask_bytes: int = 1
    """Bytes per dropout-mask element (1 for the bool masks of fused dropout kernels)."""
    tp: int = 1
    """Tensor-parallel degree (with sequence parallelism)."""
    recompute: str = "none"
    """``none`` or ``selective`` (recompute the attention core in B)."""

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE_MODES:
            raise ProblemError(
                "recompute", f"unknown {self.recompute!r}; use {' or '.join(RECOMPUTE_MODES)}"
            )
        if self.tp < 1 or self.a % self.tp:
            raise ProblemError("tp", f"got {self.tp}; it must divide the {self.a} heads")

    @classmethod
    def of(cls, card: ModelCard, *, s: int, b: int, tp: int = 1, **over: object) -> LayerShape:
        """The shape of one layer of ``card`` at sequence ``s`` and microbatch size ``b``."""
        kwargs: dict[str, object] = dict(
            s=s, b=b, h=card.hidden, a=card.heads, h_kv=card.kv_hidden, f=card.ffn_size,
            gated=card.mlp == "swiglu", attention=card.attention, dropout=card.dropout > 0,
            norm=card.norm, dtype_bytes=card.dtype_bytes, tp=tp,
        )  # fmt: skip
        kwargs.update(over)
        return cls(**kwargs)  # type: ignore[arg-type]

    @property
    def tokens(self) -> int:
        return self.s * self.b


def linear_flops(shape: LayerShape) -> float:
    """FLOPs of all linear layers of one layer in F (also in B, and in W), per GPU."""
    h, f = shape.h, shape.f
    per_token = 2 * h * (h + 2 * shape.h_kv) + 2 * h * h + (6 * h * f if shape.gated else 4 * h * f)
    return shape.tokens * per_token / shape.tp


def attention_core_flops(shape: LayerShape) -> float:
    """FLOPs of ``QK^T`` and ``PV`` in F (B does twice this), per GPU: ``4 s^2 b h / t``."""
    return 4.0 * shape.s * shape.tokens * shape.h / shape.tp


def layer_flops(shape: LayerShape) -> tuple[float, float, float]:
    """FLOPs of F, B and W of one layer, per GPU (the Zero Bubble split)."""
    lin, core = linear_flops(shape), attention_core_flops(shape)
    extra_b = core if shape.recompute == "selective" else 0.0
    return lin + core, lin + 2 * core + extra_b, lin


def activation_terms(shape: LayerShape) -> dict[str, float]:
    """Bytes each saved tensor (group) of one layer keeps from F to B, per GPU.

    Keys ending in ``scores`` are ``a s x s`` tensors; the others scale with ``s b``.
    """
    e, sb, h, a, s = shape.dtype_bytes, shape.tokens, shape.h, shape.a, shape.s
    stats = 8 if shape.norm == "layernorm" else 4  # fp32 mean+rstd, or rstd
    mask = shape.mask_bytes if shape.dropout else 0
    terms: dict[str, float] = {
        "norm_inputs": 2 * (e * h + stats) * sb,
        "qkv_input": e * h * sb,
        "mlp_fc1_input": e * h * sb,
        # GeLU keeps its input; SwiGLU keeps fc1's output (gate and up) and the SiLU output.
        "mlp_act_inputs": e * (3 * shape.f if shape.gated else shape.f) * sb,
        "mlp_fc2_input": e * shape.f * sb,
        "dropout_masks": 2 * mask * h * sb,
    }
    if shape.attention == "eager":
        terms["attn_qkv"] = 3 * e * h * sb  # Q and K for QK^T, V for PV (K, V expanded)
        terms["attn_out_input"] = e * h * sb
        scores = (e + (mask + e if shape.dropout else 0)) * a * s * sb
        terms["attn_scores"] = 0.0 if shape.recompute == "selective" else scores
    else:
        terms["attn_qkv"] = e * (h + 2 * shape.h_kv) * sb
        terms["attn_out_input"] = e * h * sb  # the kernel's output, also the projection input
        terms["attn_lse_scores"] = 4.0 * a * sb  # fp32 log-sum-exp per head and token
    return {k: v / shape.tp for k, v in terms.items()}


def layer_activation_bytes(shape: LayerShape) -> tuple[float, float]:
    """``(M_B, M_W)`` of one layer in bytes, per GPU.

    ``M_W`` is clipped to ``M_B`` (for MLP-heavy SwiGLU layers the output gradients W keeps
    can outgrow what F saved).
    """
    m_b = sum(activation_terms(shape).values())
    e, sb, h, f = shape.dtype_bytes, shape.tokens, shape.h, shape.f
    inputs = 3 * h + f
    grad_outputs = (h + 2 * shape.h_kv) + h + (2 * f if shape.gated else f) + h
    m_w = e * (inputs + grad_outputs) * sb / shape.tp
    return m_b, min(m_w, m_b)


def layer_params(card: ModelCard) -> int:
    """Parameters of one decoder layer (all tensor-parallel ranks together)."""
    h, f, h_kv = card.hidden, card.ffn_size, card.kv_hidden
    mlp_out = 2 * f if card.mlp == "swiglu" else f
    weights = h * (h + 2 * h_kv) + h * h + h * mlp_out + f * h
    biases = (h + 2 * h_kv) + h + mlp_out + h if card.bias else 0
    norms = 2 * (2 * h if card.norm == "layernorm" else h)
    return weights + biases + norms


def embedding_params(card: ModelCard) -> int:
    """Parameters of the input embedding (and learned positions), held by the first stage."""
    return card.vocab * card.hidden + (card.seq * card.hidden if card.position == "learned" else 0)


def head_params(card: ModelCard) -> int:
    """Parameters of the final norm and output layer, held by the last stage.

    Frameworks that tie the output layer to the embedding still keep a copy on the last
    pipeline stage (Megatron does), so it is counted here either way.
    """
    return card.vocab * card.hidden + (2 if card.norm == "layernorm" else 1) * card.hidden


def head_flops(card: ModelCard, tokens: int) -> float:
    """FLOPs of the output layer in F for ``tokens`` tokens (the same again in B and in W),
    all tensor-parallel ranks together: ``2 tokens h vocab``."""
    return 2.0 * tokens * card.hidden * card.vocab
