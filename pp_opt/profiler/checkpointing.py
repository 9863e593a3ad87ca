"""Activation checkpointing as frameworks run it: what a layer keeps from F to B, what B re-runs.

Modes (scripts/published/NOTES.md, "Activation checkpointing", has the citations):

* ``none``: autograd keeps every saved tensor (:func:`formulas.activation_terms`).
* ``selective``: Korthikanti et al. 2022 (Megatron's ``--recompute-activations``): drop the
  score-matrix tensors, re-run the attention core in B (what ``formulas`` already models).
* ``selective_op``: torchtitan's op-level policy (``selective_ac_option = 'op'``,
  ``parallelize_llama.py:213-276`` at 9dec370): inside each ``TransformerBlock`` the outputs of
  the 1st, 3rd, 5th, ... matmul and of SDPA are saved, every other matmul and every
  elementwise op is re-run in B. For a Llama block the matmuls run in the order
  ``wq wk wv wo w1 w3 w2``, so ``wq wv w1 w2`` are kept and ``wk wo w3`` re-run.
* ``full``: only the block's input is kept (``checkpoint_wrapper`` around the whole block,
  torchtitan ``parallelize_llama.py:233-234``; Megatron ``--recompute-granularity full``);
  B re-runs the whole forward of the layer first, holding one layer's full set of saved
  tensors while it runs its backward.

A stage may fully checkpoint only some of its layers (Megatron's ``--recompute-method block
--recompute-num-layers N``): :func:`stage_checkpoint_cost`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pp_opt.errors import ProblemError
from pp_opt.profiler.formulas import (
    LayerShape,
    activation_terms,
    attention_core_flops,
    layer_activation_bytes,
    layer_flops,
)

AC_MODES = ("none", "selective", "selective_op", "full")


@dataclass(kw_only=True, slots=True, frozen=True)
class CheckpointCost:
    """One layer (or a stage's layers) under a checkpointing mode, per GPU and microbatch."""

    kept_bytes: float
    """Bytes held from the layer's F until its B (per microbatch in flight)."""
    transient_bytes: float
    """Extra bytes held only while the layer's B runs (the re-run forward's saved tensors)."""
    f_flops: float
    """FLOPs of F."""
    b_flops: float
    """FLOPs of B (gradient w.r.t. inputs), including what B re-runs of the forward."""
    w_flops: float
    """FLOPs of W (gradient w.r.t. weights)."""
    recompute_flops: float
    """The part of ``b_flops`` that re-runs the forward (0 without checkpointing)."""


def _check_mode(mode: str) -> None:
    if mode not in AC_MODES:
        raise ProblemError("ac", f"unknown {mode!r}; use one of {', '.join(AC_MODES)}")


def layer_input_bytes(shape: LayerShape) -> float:
    """Bytes of one layer's input: ``e s b h / t`` (sequence-parallel when ``t > 1``)."""
    return shape.dtype_bytes * shape.tokens * shape.h / shape.tp


def op_sac_matmuls(shape: LayerShape) -> list[tuple[str, int, int, bool]]:
    """The block's matmuls in call order: ``(name, input width, output width, row-parallel)``.

    Row-parallel outputs (``wo``, ``w2``) are partial sums of the full width before their
    reduce-scatter, so under tensor parallelism they are not split ``t`` ways.
    """
    h, h_kv, f = shape.h, shape.h_kv, shape.f
    if shape.gated:
        return [("wq", h, h, False), ("wk", h, h_kv, False), ("wv", h, h_kv, False),
                ("wo", h, h, True), ("w1", h, f, False), ("w3", h, f, False),
                ("w2", f, h, True)]  # fmt: skip
    return [("wqkv", h, h + 2 * h_kv, False), ("wo", h, h, True), ("fc1", h, f, False),
            ("fc2", f, h, True)]  # fmt: skip


def _op_sac_cost(shape: LayerShape) -> tuple[float, float]:
    """``(kept bytes, recompute FLOPs)`` of torchtitan's op-level selective checkpointing."""
    e, sb, t = shape.dtype_bytes, shape.tokens, shape.tp
    kept = layer_input_bytes(shape)
    recompute = 0.0
    for index, (_name, width_in, width, row_parallel) in enumerate(op_sac_matmuls(shape), 1):
        split = 1 if row_parallel else t
        if index % 2:  # 1st, 3rd, ...: saved
            kept += e * sb * width / split
            if row_parallel and t > 1:  # the reduce-scatter output is saved too
                kept += e * sb * width / t
        else:
            recompute += 2.0 * sb * width_in * width / t
    kept += e * sb * shape.h / t + 4.0 * shape.a * sb / t  # SDPA output and its fp32 log-sum-exp
    return kept, recompute


def layer_checkpoint_cost(shape: LayerShape, mode: str) -> CheckpointCost:
    """What one layer keeps and re-runs under ``mode``, per GPU and microbatch."""
    _check_mode(mode)
    plain = replace(shape, recompute="none")
    f, b, w = layer_flops(plain)
    m_b_plain = layer_activation_bytes(plain)[0]
    if mode == "none":
        return CheckpointCost(
            kept_bytes=m_b_plain, transient_bytes=0.0, f_flops=f, b_flops=b, w_flops=w,
            recompute_flops=0.0,
        )  # fmt: skip
    if mode == "selective":
        sel = replace(shape, recompute="selective")
        f, b, w = layer_flops(sel)
        kept = sum(activation_terms(sel).values())
        return CheckpointCost(
            kept_bytes=kept, transient_bytes=0.0, f_flops=f, b_flops=b, w_flops=w,
            recompute_flops=attention_core_flops(sel),
        )  # fmt: skip
    if mode == "selective_op":
        kept, recompute = _op_sac_cost(plain)
        return CheckpointCost(
            kept_bytes=kept, transient_bytes=max(m_b_plain - kept, 0.0), f_flops=f,
            b_flops=b + recompute, w_flops=w, recompute_flops=recompute,
        )  # fmt: skip
    kept = layer_input_bytes(plain)
    return CheckpointCost(
        kept_bytes=kept, transient_bytes=m_b_plain, f_flops=f, b_flops=b + f, w_flops=w,
        recompute_flops=f,
    )  # fmt: skip


def stage_checkpoint_cost(
    shape: LayerShape, *, layers: int, full_layers: int, base_mode: str = "none"
) -> CheckpointCost:
    """A stage of ``layers`` layers, ``full_layers`` of them fully checkpointed, the rest in
    ``base_mode`` (Megatron's block method: the first ``N`` layers of the stage are full).

    The transient of the stage is the largest one layer needs (B runs one layer at a time).
    """
    if layers < 0 or not 0 <= full_layers <= layers:
        raise ProblemError(
            "full_layers", f"got {full_layers} of {layers} layers; give 0 <= N <= layers"
        )
    if base_mode == "full":
        raise ProblemError("base_mode", "give the mode of the layers not fully checkpointed")
    full = layer_checkpoint_cost(shape, "full")
    base = layer_checkpoint_cost(shape, base_mode)
    rest = layers - full_layers
    transient = max(full.transient_bytes if full_layers else 0.0,
                    base.transient_bytes if rest else 0.0)  # fmt: skip
    return CheckpointCost(
        kept_bytes=full_layers * full.kept_bytes + rest * base.kept_bytes,
        transient_bytes=transient,
        f_flops=layers * full.f_flops,
        b_flops=full_layers * full.b_flops + rest * base.b_flops,
        w_flops=layers * full.w_flops,
        recompute_flops=full_layers * full.recompute_flops + rest * base.recompute_flops,
    )
