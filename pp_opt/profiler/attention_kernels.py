"""The fused attention kernel's own rate, beside the card's GEMM rate.

A fused attention kernel (FlashAttention-2 behind PyTorch's SDPA, cuDNN behind Transformer
Engine's ``DotProductAttention``) runs well below a large GEMM on the same GPU: the FA3
paper measures FlashAttention-2 at 335 TFLOP/s and cuDNN at 539 in the forward (causal, head
dim 128, 16k tokens) on an H100 SXM5 whose large BF16 GEMMs reach about 650. Where a hardware
card lists a kernel's measured rates (``[attention.<kernel>]``) and the job's stack names that
kernel (:attr:`StackCard.attention_kernel`), the attention core is timed at them; otherwise
at the card's GEMM rate.

Rates are per sequence length (the kernel's keys), interpolated in ``log2`` of it and held
at the ends. As the FlashAttention papers count them, the backward does 2.5 times the
forward's FLOPs (it recomputes the scores: five matrix products to the forward's two).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pp_opt.errors import ProblemError

BACKWARD_FLOPS = 2.5
"""The backward's FLOPs over the forward's, as the FlashAttention papers count them."""
KEYS = ("seq", "forward_tflops", "backward_tflops", "source")


@dataclass(kw_only=True, slots=True, frozen=True)
class AttentionRates:
    """One kernel's measured forward and backward rates on one GPU, by sequence length."""

    kernel: str
    seq: tuple[int, ...]
    forward_tflops: tuple[float, ...]
    backward_tflops: tuple[float, ...]
    """Backward FLOPs (:data:`BACKWARD_FLOPS` times the forward's) per second, 1e12."""
    source: str = ""

    def rates(self, seq: float) -> tuple[float, float]:
        """``(forward, backward)`` FLOP/s at ``seq`` keys."""
        return (_interpolate(self.seq, self.forward_tflops, seq) * 1e12,
                _interpolate(self.seq, self.backward_tflops, seq) * 1e12)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"seq": list(self.seq), "forward_tflops": list(self.forward_tflops),
                "backward_tflops": list(self.backward_tflops), "source": self.source}  # fmt: skip


def _interpolate(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        if x <= x1:
            w = math.log2(x / x0) / math.log2(x1 / x0)
            return y0 + w * (y1 - y0)
    return ys[-1]


def attention_table(data: Any) -> tuple[AttentionRates, ...]:
    """A hardware card's ``attention`` table (``{kernel: {seq, forward_tflops,
    backward_tflops, source}}``), checked; already-built rates pass through."""
    if isinstance(data, tuple) and all(isinstance(r, AttentionRates) for r in data):
        return data
    if not isinstance(data, Mapping):
        raise ProblemError("hardware.attention", "give a table of kernels: [attention.cudnn] ...")
    return tuple(_rates(str(kernel), row) for kernel, row in sorted(data.items()))


def _rates(kernel: str, row: Any) -> AttentionRates:
    where = f"hardware.attention.{kernel}"
    if not isinstance(row, Mapping):
        raise ProblemError(where, "give seq, forward_tflops and backward_tflops lists")
    for key in row:
        if key not in KEYS:
            raise ProblemError(f"{where}.{key}", f"unknown key; allowed keys are {', '.join(KEYS)}")
    lists = {}
    for key in KEYS[:3]:
        values = row.get(key)
        if not isinstance(values, list | tuple) or not values:
            raise ProblemError(f"{where}.{key}", "missing; give a non-empty list of numbers")
        if any(isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
               or v <= 0 for v in values):  # fmt: skip
            raise ProblemError(f"{where}.{key}", f"got {values!r}; give numbers greater than 0")
        lists[key] = tuple(values)
    if len({len(v) for v in lists.values()}) != 1:
        raise ProblemError(where, "seq, forward_tflops and backward_tflops need equal lengths")
    if any(b <= a for a, b in zip(lists["seq"], lists["seq"][1:])):  # noqa: B905
        raise ProblemError(f"{where}.seq", "give increasing sequence lengths")
    return AttentionRates(kernel=kernel, seq=tuple(int(s) for s in lists["seq"]),
                          forward_tflops=tuple(float(v) for v in lists["forward_tflops"]),
                          backward_tflops=tuple(float(v) for v in lists["backward_tflops"]),
                          source=str(row.get("source", "")))  # fmt: skip


def kernel_rates(table: tuple[AttentionRates, ...], kernel: str) -> AttentionRates | None:
    """The card's rates for ``kernel``, or ``None`` (the core then runs at the GEMM rate)."""
    return next((r for r in table if r.kernel == kernel), None)


def core_attention_ms(
    flops: float, *, table: tuple[AttentionRates, ...], kernel: str, seq: float,
    gemm_rate: float,
) -> tuple[float, float]:  # fmt: skip
    """``(forward, backward)`` ms of an attention core of ``flops`` forward FLOPs (masked
    blocks already left out) over ``seq`` keys. Without the kernel's rates: the forward at
    ``gemm_rate`` and a backward of twice the forward's FLOPs, as the GEMM model counts."""
    rates = kernel_rates(table, kernel)
    if rates is None:
        return 1e3 * flops / gemm_rate, 2e3 * flops / gemm_rate
    fwd, bwd = rates.rates(seq)
    return 1e3 * flops / fwd, 1e3 * BACKWARD_FLOPS * flops / bwd
