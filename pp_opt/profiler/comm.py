"""Communication and memory-traffic times: ring collectives, point-to-point sends, host copies
and HBM passes. Every cost that moves bytes is stated here once; the profiler and the
planner's step time call these."""

from __future__ import annotations

from pp_opt.errors import ProblemError
from pp_opt.profiler.cards import GB, HardwareCard


def ring_all_reduce_ms(nbytes: float, n: int, gbs: float, latency_us: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks at ``gbs`` GB/s each way (ms):
    ``2 (n - 1) / n`` of the bytes and ``2 (n - 1)`` latencies (a reduce-scatter, then an
    all-gather)."""
    return 2 * ring_all_gather_ms(nbytes, n, gbs, latency_us)


def ring_all_gather_ms(nbytes: float, n: int, gbs: float, latency_us: float) -> float:
    """Ring all-gather (or reduce-scatter) of ``nbytes`` in all over ``n`` ranks (ms):
    ``(n - 1) / n`` of the bytes and ``n - 1`` latencies; 0 for one rank."""
    if n <= 1:
        return 0.0
    return 1e3 * (n - 1) / n * nbytes / (gbs * GB) + (n - 1) * latency_us * 1e-3


ring_reduce_scatter_ms = ring_all_gather_ms
"""A ring reduce-scatter moves what a ring all-gather moves."""


def p2p_ms(nbytes: float, gbs: float, latency_us: float) -> float:
    """One point-to-point message of ``nbytes`` (ms)."""
    return latency_us * 1e-3 + 1e3 * nbytes / (gbs * GB)


def copy_ms(nbytes: float, gbs: float) -> float:
    """A host copy (offload or reload) of ``nbytes`` at ``gbs`` GB/s (ms)."""
    return 1e3 * nbytes / (gbs * GB)


def hbm_ms(nbytes: float, hw: HardwareCard) -> float:
    """One pass of ``nbytes`` through HBM at the card's effective bandwidth (ms)."""
    return 1e3 * nbytes / (hw.hbm_gbs * GB * hw.hbm_efficiency)


def gemm_ms(flops: float, hw: HardwareCard) -> float:
    """``flops`` of matrix products at the card's effective GEMM rate (ms)."""
    return 1e3 * flops / hw.gemm_flops


def fp8_gemm_ms(flops: float, hw: HardwareCard) -> float:
    """``flops`` of Float8 matrix products at the card's effective FP8 rate (ms)."""
    rate = hw.fp8_peak_tflops * 1e12 * hw.fp8_gemm_efficiency
    if rate <= 0:
        raise ProblemError("fp8", f"{hw.name} has no FP8 peak (fp8_peak_tflops); drop --fp8")
    return 1e3 * flops / rate


def node_link(hw: HardwareCard, spans_nodes: bool) -> tuple[float, float]:
    """``(GB/s, latency in µs)`` of a group of GPUs: the inter-node link when the group spans
    nodes, else the intra-node one."""
    if spans_nodes:
        return hw.inter_node_gbs, hw.inter_node_latency_us
    return hw.intra_node_gbs, hw.intra_node_latency_us
