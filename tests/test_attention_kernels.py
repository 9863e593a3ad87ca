"""The fused attention kernel's measured rates: the card table, its lookup and its use."""

from __future__ import annotations

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.attention_kernels import BACKWARD_FLOPS, core_attention_ms
from pp_opt.profiler.cards import hardware_card_from_dict, load_hardware_card, load_model_card
from pp_opt.profiler.formulas import LayerShape, attention_core_flops
from pp_opt.profiler.job_costs import dense_core_ms
from pp_opt.profiler.moe import Layout, attention_parts, context_length, layer_unit
from pp_opt.profiler.stacks import load_stack_card

ROOT = Path(__file__).resolve().parents[1]


def test_the_h100_card_gives_the_fa3_papers_rates_at_and_between_its_lengths() -> None:
    hw = load_hardware_card("h100-80gb")
    cudnn = next(r for r in hw.attention if r.kernel == "cudnn")
    assert cudnn.rates(4096) == (518e12, 499e12)
    assert cudnn.rates(100) == (315e12, 305e12)  # held at the ends
    assert cudnn.rates(1 << 20) == (539e12, 516e12)
    # halfway in log2 between 4k and 8k
    fwd, _ = cudnn.rates(4096 * 2**0.5)
    assert fwd == pytest.approx((518 + 529) / 2 * 1e12)


def test_without_the_kernels_rates_the_core_runs_at_the_gemm_rate() -> None:
    hw = load_hardware_card("h100-96gb-500w")  # no measured attention rates at 500 W
    assert hw.attention == ()
    f, b = core_attention_ms(1e12, table=hw.attention, kernel="flash2", seq=8192, gemm_rate=5e14)
    assert (f, b) == pytest.approx((2.0, 4.0))
    h100 = load_hardware_card("h100-80gb")
    f, b = core_attention_ms(1e12, table=h100.attention, kernel="cudnn", seq=4096,
                             gemm_rate=5e14)  # fmt: skip
    assert (f, b) == pytest.approx((1e3 / 518, 1e3 * BACKWARD_FLOPS / 499))


def test_the_card_round_trips_through_its_dict() -> None:
    hw = load_hardware_card("h100-80gb")
    data = json.loads(json.dumps(hw.to_dict()))
    assert hardware_card_from_dict(data, hw.name) == hw


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"seq": [1, 2], "forward_tflops": [1, 2]}, "backward_tflops"),
        ({"seq": [2, 1], "forward_tflops": [1, 2], "backward_tflops": [1, 2]}, "seq"),
        ({"seq": [1, 2], "forward_tflops": [1, -2], "backward_tflops": [1, 2]}, "forward_tflops"),
        ({"seq": [1, 2], "forward_tflops": [1], "backward_tflops": [1, 2]}, "cudnn"),
        ({"seq": [1], "forward_tflops": [1], "backward_tflops": [1], "peak": 3}, "peak"),
    ],
)
def test_a_bad_attention_table_names_its_field(row: dict[str, object], field: str) -> None:
    data = load_hardware_card("h100-80gb").to_dict()
    data["attention"] = {"cudnn": row}
    with pytest.raises(ProblemError) as err:
        hardware_card_from_dict(data, "bad")
    assert field in err.value.field


def test_an_moe_layers_core_runs_at_its_stacks_kernel() -> None:
    # 16k tokens: compute, not the megatron-core card's host time, bounds the layer
    card, hw = load_model_card("qwen3-235b-a22b"), load_hardware_card("h100-80gb")
    jobs = {name: Job(pp=1, microbatches=1, seq=16384, tp=2, ep=8, dp=8, stack=name)
            for name in ("megatron-core", "torchtitan")}  # fmt: skip
    cores = {}
    for name, job in jobs.items():
        lay = Layout.of(job, load_stack_card(name))
        att = attention_parts(card)
        flops = 2 * context_length(card, 16384) * (att["core_qk"] + att["core_v"]) * lay.tokens / 2
        plain = replace(hw, attention=())
        cores[name] = (layer_unit(card, hw, job, moe=True)["t_b"]
                       - layer_unit(card, plain, job, moe=True)["t_b"])  # fmt: skip
        gemm = hw.peak_flops * hw.gemm_efficiency
        kernel = load_stack_card(name).attention_kernel
        rates = next(r for r in hw.attention if r.kernel == kernel).rates(16384)
        expected = 1e3 * flops * (BACKWARD_FLOPS / rates[1] - 2 / gemm)
        assert cores[name] == pytest.approx(expected, rel=1e-9)
    # FlashAttention-2 is slower than cuDNN: torchtitan's B gains more over the GEMM rate
    assert cores["torchtitan"] > cores["megatron-core"] > 0


def test_a_dense_flash_layer_runs_the_causal_half_at_the_kernels_rate() -> None:
    """Dense cards count the full square (``4 s^2 b h``); a fused kernel with measured rates
    runs its causal half, the backward at 2.5x the forward's FLOPs. Eager attention and a card
    without rates keep the GEMM rate on the full count (torchtitan's fitted rows)."""
    card = load_model_card("llama3-8b")
    job = Job(pp=1, microbatches=1, seq=8192)  # torchtitan: flash2
    shape = LayerShape.of(card, s=8192, b=1, tp=1)
    core = attention_core_flops(shape)
    hw = load_hardware_card("h100-80gb")
    fwd, bwd = next(r for r in hw.attention if r.kernel == "flash2").rates(8192)
    assert dense_core_ms(shape, hw, job) == pytest.approx(
        (1e3 * core / 2 / fwd, 1e3 * BACKWARD_FLOPS * core / 2 / bwd)
    )
    gemm = (1e3 * core / (hw.peak_flops * hw.gemm_efficiency),
            2e3 * core / (hw.peak_flops * hw.gemm_efficiency))  # fmt: skip
    assert dense_core_ms(replace(shape, attention="eager"), hw, job) == pytest.approx(gemm)
    assert dense_core_ms(shape, replace(hw, attention=()), job) == pytest.approx(gemm)


def test_the_fit_writes_its_constants_above_a_cards_attention_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench_published.py --fit`` rewrites each fitted key in place (its indented comment
    with it) and puts a key the card lacks before the first ``[table]``, not inside it."""
    spec = importlib.util.spec_from_file_location("bench_fit", ROOT / "scripts/bench_published.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    shutil.copy(ROOT / "models/h100-80gb.toml", tmp_path / "h100-80gb.toml")
    monkeypatch.setattr(bench, "CARDS", tmp_path)
    hw = load_hardware_card(tmp_path / "h100-80gb.toml")
    fitted = replace(hw, fp8_gemm_efficiency=0.4321, pipeline_fragmentation=0.1234)
    bench.write_card(fitted)
    text = (tmp_path / "h100-80gb.toml").read_text()
    again = load_hardware_card(tmp_path / "h100-80gb.toml")
    assert again == replace(fitted, name=again.name)
    assert text.index("pipeline_fragmentation") < text.index("[attention")
    assert "cuBLASLt FP8" not in text  # the old key's indented comment went with it
