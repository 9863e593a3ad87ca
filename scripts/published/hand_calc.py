"""Hand calculation of torchtitan's published rows from the issue-27 formula modules.

A check for the integration, not the model itself: it composes the pure formulas of
``pp_opt.profiler.{checkpointing,fsdp,kernels}`` with the ``h100-96gb-500w`` card and the
closed-form pipeline makespans of 1F1B and interleaved 1F1B (uniform stages), and prints
step time, TPS/GPU and peak memory per row of ``rows.json`` beside the measurement. The
four fitted constants are the placeholders of NOTES.md ("Fitted constants").

    PYTHONPATH=. .venv/bin/python scripts/published/hand_calc.py          # placeholders
    PYTHONPATH=. .venv/bin/python scripts/published/hand_calc.py --fit    # grid fit first

``--fit`` grid-searches the BF16, FP8 and HBM efficiencies on the three Table 1 rows (one
constant per row: FSDP, + compile, + Float8) and prints every row with them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pp_opt.profiler.cards import GIB, load_hardware_card, load_model_card
from pp_opt.profiler.checkpointing import layer_checkpoint_cost
from pp_opt.profiler.formulas import LayerShape, attention_core_flops, layer_params
from pp_opt.profiler.fsdp import ring_time, sharded_state_bytes, unsharded_bytes
from pp_opt.profiler.kernels import (
    elementwise_bytes,
    fp8_cast_bytes,
    gemm_seconds,
    tp_collective_bytes,
    tp_exposed_s,
)

FP8_TFLOPS = 1979.0  # H100 SXM dense FP8 (datasheet); a card field to add
FIT = {"bf16_eff": 0.60, "fp8_eff": 0.45, "hbm_eff": 1.0, "mem_overhead": 1.10}
CAUSAL = 0.5  # flash attention skips the masked half of the score blocks
LOSS_BYTES_PER_LOGIT = 40.0  # HBM traffic: fp32 upcast, log-softmax F, its gradient B, bf16 grad
LOSS_PEAK_BYTES_PER_LOGIT = 12.0  # held at once in B: saved log-softmax, its grad, input grad


def layer_times(shape: LayerShape, cfg: dict[str, Any], hw: Any) -> tuple[float, float]:
    """(F, B+W) seconds of one layer and one microbatch, checkpointing included."""
    cost = layer_checkpoint_cost(shape, cfg["ac"])
    core = attention_core_flops(shape) * CAUSAL
    lin_f = cost.f_flops - attention_core_flops(shape)
    fp8 = cfg["fp8"]

    def gemm(linear: float, attention: float) -> float:
        return gemm_seconds(
            bf16_flops=attention + (0.0 if fp8 else linear), fp8_flops=linear if fp8 else 0.0,
            bf16_tflops=hw.peak_tflops, bf16_efficiency=FIT["bf16_eff"],
            fp8_tflops=FP8_TFLOPS, fp8_efficiency=FIT["fp8_eff"],
        )  # fmt: skip

    bw = hw.hbm_gbs * 1e9 * FIT["hbm_eff"]
    elem = elementwise_bytes(shape, compiled=cfg["compile"]) / bw
    cast = fp8_cast_bytes(shape) / bw if fp8 else 0.0
    fwd_gemm = gemm(lin_f, core)
    t_f = fwd_gemm + elem + cast / 3
    t_b = gemm(2 * lin_f, 2 * core) + 2 * elem + 2 * cast / 3
    if shape.tp > 1:
        fwd_bytes, bwd_bytes = tp_collective_bytes(shape, fp8_gather=fp8)
        link = hw.intra_node_gbs * 1e9
        t_f += tp_exposed_s(fwd_bytes / link, fwd_gemm, tp=shape.tp, async_tp=cfg["async_tp"])
        t_b += tp_exposed_s(bwd_bytes / link, 2 * fwd_gemm, tp=shape.tp, async_tp=cfg["async_tp"])
    if cfg["ac"] == "full":
        t_b += t_f  # B re-runs the layer's forward (collectives included)
    elif cfg["ac"] == "selective_op":
        t_b += gemm(cost.recompute_flops, 0.0) + elem  # re-run matmuls and all elementwise ops
    return t_f, t_b


def head_times(card: Any, tokens: int, tp: int, hw: Any) -> tuple[float, float]:
    """(F, B) of the output layer (BF16: Float8 skips it) and the loss."""
    flops = 2.0 * tokens * card.hidden * card.vocab / tp
    gemm = flops / (hw.peak_tflops * 1e12 * FIT["bf16_eff"])
    loss = LOSS_BYTES_PER_LOGIT * tokens * card.vocab / tp / (hw.hbm_gbs * 1e9 * FIT["hbm_eff"])
    return gemm + loss / 2, 2 * gemm + loss / 2


def predict(row: dict[str, Any]) -> dict[str, float]:
    cfg = row["config"]
    card, hw = load_model_card(cfg["model"]), load_hardware_card(cfg["hardware"])
    tp, pp, shard, m = cfg["tp"], cfg["pp"], cfg["dp_shard"], cfg["microbatches"]
    shape = LayerShape.of(card, s=cfg["seq"], b=cfg["mbs"], tp=tp)
    t_f, t_b = layer_times(shape, cfg, hw)
    tokens = cfg["mbs"] * cfg["seq"]
    h_f, h_b = head_times(card, tokens, tp, hw)
    fsdp_link = hw.intra_node_gbs if shard * tp <= hw.gpus_per_node else hw.inter_node_gbs
    lp = layer_params(card) / tp
    root = (card.vocab * card.hidden * 2) / tp
    rank_layers = max(sum(cfg["layers_per_stage"][r::pp]) for r in range(pp))
    if pp == 1:
        ag = ring_time((lp + root) * 2, shard, gbs=fsdp_link, latency_us=20.0)
        rs = ring_time(root * 4, shard, gbs=fsdp_link, latency_us=20.0)
        compute = card.layers * (t_f + t_b) + h_f + h_b
        step = compute + ag + rs
    else:
        v = cfg["stages_per_rank"]
        stage = rank_layers * (t_f + t_b) + (h_f + h_b) / v  # head spread: a rough bound
        step = (m + (pp - 1) / v) * stage
        first_stage_layers = cfg["layers_per_stage"][0]
        rs = ring_time(first_stage_layers * lp * 4, shard, gbs=fsdp_link, latency_us=20.0)
        ag = ring_time(lp * 1, shard, gbs=fsdp_link, latency_us=20.0)
        step += rs + ag
    rank_params = rank_params_of(cfg, card)
    step += 40.0 * rank_params / shard / (hw.hbm_gbs * 1e9)  # AdamW + clipping passes
    tps = cfg["local_batch"] * cfg["seq"] / (step * tp * pp * cfg["cp"])
    return {"step_s": step, "tps": tps, "mem_gib": memory(row, card, shape, rank_params) / GIB}


def rank_params_of(cfg: dict[str, Any], card: Any) -> float:
    """Parameters per GPU on the pipeline rank with the most layers (embedding or head: half
    of the root's parameters under PP, all of them without)."""
    tp, pp = cfg["tp"], cfg["pp"]
    root = card.vocab * card.hidden * 2 / tp
    rank_layers = max(sum(cfg["layers_per_stage"][r::pp]) for r in range(pp))
    return rank_layers * layer_params(card) / tp + (root / 2 if pp > 1 else root)


def memory(row: dict[str, Any], card: Any, shape: LayerShape, rank_params: float) -> float:
    """Peak bytes of the worst pipeline rank, times the allocator overhead factor."""
    return max(sum(parts.values()) for parts in memory_parts(row, card, shape, rank_params))


def memory_parts(
    row: dict[str, Any], card: Any, shape: LayerShape, rank_params: float
) -> list[dict[str, float]]:
    """Per pipeline rank: the terms of its peak (bytes, overhead factor applied)."""
    cfg = row["config"]
    pp, shard, m, k = cfg["pp"], cfg["dp_shard"], cfg["microbatches"], FIT["mem_overhead"]
    cost = layer_checkpoint_cost(shape, cfg["ac"])
    static = sharded_state_bytes(rank_params, shard=shard)
    tokens = cfg["mbs"] * cfg["seq"]
    logits = LOSS_PEAK_BYTES_PER_LOGIT * tokens * card.vocab / cfg["tp"]
    lp = layer_params(card) / cfg["tp"]
    if pp == 1:
        gathered = unsharded_bytes(2 * lp + card.vocab * card.hidden * 2, with_grads=False)
        parts = {
            "static": static,
            "activations": card.layers * cost.kept_bytes,
            "gathered": gathered,
            "loss": logits,
            "transient": cost.transient_bytes,
        }
        return [{key: k * value for key, value in parts.items()}]  # fmt: skip
    v, layers = cfg["stages_per_rank"], cfg["layers_per_stage"]
    out = []
    for r in range(pp):
        chunks = layers[r::pp]
        warm = min(pp - r, m) if v == 1 else min((v - 1) * pp + 2 * (pp - 1 - r) + 1, m * v)
        in_flight = warm * sum(chunks) / v  # layer-microbatches held at the first backward
        grads_chunks = sum(chunks) if v == 1 else chunks[-1]  # interleaved: last chunk only
        param_b = 1.0 if cfg["fp8_fsdp_all_gather"] else 2.0
        parts = {
            "static": static,
            "activations": in_flight * cost.kept_bytes,
            "gathered": unsharded_bytes(sum(chunks) * lp, param_bytes=param_b, with_grads=False),
            "fp32_grads": 4.0 * grads_chunks * lp,
            "transient": cost.transient_bytes,
            "loss": logits if r == pp - 1 else 0.0,
        }
        out.append({key: k * value for key, value in parts.items()})
    return out


FIT_ROWS = ("table1-fsdp", "table1-fsdp-torchcompile", "table1-fsdp-torchcompile-float8")


def fit(rows: list[dict[str, Any]]) -> None:
    """Least squares of the TPS ratios of ``FIT_ROWS`` over a grid of the three efficiencies."""
    chosen = [row for row in rows if row["id"] in FIT_ROWS]
    best: tuple[float, float, float, float] | None = None
    for b16 in range(30, 71, 2):
        for f8 in range(20, 71, 2):
            for hbm in range(30, 101, 5):
                FIT.update(bf16_eff=b16 / 100, fp8_eff=f8 / 100, hbm_eff=hbm / 100)
                err = sum((predict(r)["tps"] / r["measured"]["tps_per_gpu"] - 1) ** 2
                          for r in chosen)  # fmt: skip
                if best is None or err < best[0]:
                    best = (err, b16 / 100, f8 / 100, hbm / 100)
    if best is not None:
        FIT.update(bf16_eff=best[1], fp8_eff=best[2], hbm_eff=best[3])
    print("fitted on", ", ".join(FIT_ROWS), "->", FIT)


def main() -> None:
    rows = json.loads((Path(__file__).parent / "rows.json").read_text())["rows"]
    if "--fit" in sys.argv[1:]:
        fit(rows)
    if "--breakdown" in sys.argv[1:]:
        for row in rows:
            cfg = row["config"]
            card = load_model_card(cfg["model"])
            shape = LayerShape.of(card, s=cfg["seq"], b=cfg["mbs"], tp=cfg["tp"])
            rank_params = rank_params_of(cfg, card)
            for r, parts in enumerate(memory_parts(row, card, shape, rank_params)):
                terms = " ".join(f"{key}={value / GIB:.1f}" for key, value in parts.items())
                print(f"{row['id']} rank {r}: {terms} GiB")
    print(f"{'row':38} {'step s':>8} {'TPS/GPU':>8} {'meas':>6} {'ratio':>6} "
          f"{'GiB':>6} {'meas':>6} {'ratio':>6}")  # fmt: skip
    for row in rows:
        got, meas = predict(row), row["measured"]
        print(f"{row['id']:38} {got['step_s']:8.3f} {got['tps']:8.0f} {meas['tps_per_gpu']:6} "
              f"{got['tps'] / meas['tps_per_gpu']:6.3f} {got['mem_gib']:6.1f} "
              f"{meas['memory_gib']:6.1f} {got['mem_gib'] / meas['memory_gib']:6.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
