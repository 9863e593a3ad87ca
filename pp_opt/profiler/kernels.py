"""What Float8 linears, torch.compile and AsyncTP change in one decoder layer's time.

* **Float8** (torchtitan ``float8.py:84-100`` at 9dec370, torchao ``Float8Linear`` with
  dynamic tensorwise scaling): every ``nn.Linear`` of the model but ``output`` runs its three
  GEMMs (F, the input gradient in B, the weight gradient in W) on FP8 tensor cores; the
  attention core (SDPA) and the output layer stay BF16. Each FP8 GEMM operand is first scaled
  and cast: an amax pass and a cast pass over it (:func:`fp8_cast_bytes`).
* **torch.compile** (``parallelize_llama.py:297-306``): each ``TransformerBlock`` is compiled
  (``fullgraph=True``); the GEMMs and SDPA are the same kernels, the elementwise ops between
  them (RMSNorm, RoPE, SiLU * up, residual adds, Float8 casts) fuse into a few kernels, so the
  block reads and writes HBM fewer times (:func:`elementwise_bytes`).
* **AsyncTP** (``parallelize_llama.py:201-205``, needs compile): inductor's micro-pipelining
  splits each sequence-parallel all-gather / reduce-scatter into ``t`` chunks, each overlapped
  with the matmul of the previous chunk (:func:`tp_exposed_s`).

The byte counts of the eager block are our count of the ops in torchtitan's
``models/llama/model.py`` and ``models/norms.py`` (``RMSNorm`` computes in fp32:
``x.float()``, ``pow(2).mean``, ``x * rsqrt``, ``type_as``, ``* weight``; RoPE via complex
fp32 views; ``repeat_kv`` materialises k and v for all heads before SDPA; SwiGLU
``silu(w1 x) * w3 x``); the compiled counts assume each fused region reads its inputs and
writes its outputs once. Neither is fitted; the card's ``hbm_efficiency`` is.
"""

from __future__ import annotations

from pp_opt.errors import ProblemError
from pp_opt.profiler.formulas import LayerShape


def gemm_seconds(
    *, bf16_flops: float, fp8_flops: float, bf16_tflops: float, bf16_efficiency: float,
    fp8_tflops: float, fp8_efficiency: float,
) -> float:  # fmt: skip
    """Seconds of GEMM work split between the BF16 and the FP8 tensor cores."""
    for field, value in (("bf16_tflops", bf16_tflops * bf16_efficiency),
                         ("fp8_tflops", fp8_tflops * fp8_efficiency)):  # fmt: skip
        if value <= 0:
            raise ProblemError(field, "peak times efficiency must be > 0")
    return bf16_flops / (bf16_tflops * bf16_efficiency * 1e12) + fp8_flops / (
        fp8_tflops * fp8_efficiency * 1e12
    )


def fp8_cast_bytes(shape: LayerShape) -> float:
    """HBM bytes of Float8's dynamic scaling in one layer's F + B + W, per GPU.

    Each distinct GEMM operand gets an amax pass (read ``e`` bytes) and a cast (read ``e``,
    write 1). F casts the 4 distinct linear inputs (norm outputs twice, attention output,
    SwiGLU product); B casts the 4 output gradients it multiplies (q/k/v, wo, gate/up, w2);
    W reuses them (transposed FP8 copies: read 1, write 1 each). Weights are cast when they
    are all-gathered (FP8 all-gather) and are left out.
    """
    e, sb, t = shape.dtype_bytes, shape.tokens, shape.tp
    widths_in = [shape.h, shape.h, shape.h, shape.f]
    widths_grad = [shape.h + 2 * shape.h_kv, shape.h, 2 * shape.f if shape.gated else shape.f,
                   shape.h]  # fmt: skip
    per = 2 * e + 1
    total = sum(widths_in) * per + sum(widths_grad) * per + 2 * (sum(widths_in) + sum(widths_grad))
    return total * sb / t


def elementwise_bytes(shape: LayerShape, *, compiled: bool) -> float:
    """HBM bytes of one layer's elementwise ops in F, per GPU (B moves about twice this).

    Eager per token: two fp32 RMSNorms (36 ``h`` each), RoPE on q and k (20 ``h`` + 20
    ``h_kv``), ``repeat_kv`` expanding k and v to all heads (read 4 ``h_kv``, write 4 ``h``),
    the attention output's ``transpose(1, 2).contiguous()`` (4 ``h``), two residual adds
    (6 ``h`` each), SwiGLU (10 ``f``): ``112 h + 24 h_kv + 10 f``. Compiled: add+norm fused
    (8 ``h`` each), RoPE fused (4 ``h`` + 4 ``h_kv``), the expanded k and v still written
    (4 ``h``), the output copy (4 ``h``), SwiGLU fused (6 ``f``): ``28 h + 4 h_kv + 6 f``.
    """
    h, h_kv, f = shape.h, shape.h_kv, shape.f
    if not shape.gated:
        raise ProblemError("mlp", "elementwise counts are for Llama (SwiGLU, RMSNorm) layers")
    per_token = 28 * h + 4 * h_kv + 6 * f if compiled else 112 * h + 24 * h_kv + 10 * f
    return per_token * shape.tokens / shape.tp


def tp_collective_bytes(shape: LayerShape, *, fp8_gather: bool = False) -> tuple[float, float]:
    """``(F, B)`` bytes each GPU sends in one layer's sequence-parallel collectives.

    F: two all-gathers (before attention and MLP; in FP8 with Float8's colwise style) and two
    reduce-scatters (after ``wo`` and ``w2``) of the ``s b h`` activation. B: the mirror
    (reduce-scatters of the input gradients, all-gathers of the output gradients), in bf16.
    """
    t = shape.tp
    full = shape.tokens * shape.h * (t - 1) / t
    gather = 1.0 if fp8_gather else float(shape.dtype_bytes)
    forward = 2 * full * gather + 2 * full * shape.dtype_bytes
    backward = 4 * full * shape.dtype_bytes
    return forward, backward


def tp_exposed_s(comm_s: float, gemm_s: float, *, tp: int, async_tp: bool) -> float:
    """Seconds of tensor-parallel communication left on the critical path.

    Synchronous TP: all of it. AsyncTP: the first of ``t`` chunks, plus whatever of the rest
    outlasts the matmuls it overlaps.
    """
    if tp <= 1:
        return 0.0
    if not async_tp:
        return comm_s
    return comm_s / tp + max(comm_s - gemm_s, 0.0) * (tp - 1) / tp
