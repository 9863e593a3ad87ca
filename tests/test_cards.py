"""Model and hardware cards: every bundled card loads, keys are checked, shapes add up."""

from __future__ import annotations

import pytest

from pp_opt.errors import ProblemError
from pp_opt.profiler.cards import (
    bundled_cards,
    hardware_card_from_dict,
    load_hardware_card,
    load_model_card,
    model_card_from_dict,
)
from pp_opt.profiler.formulas import embedding_params, head_params, layer_params

MODELS = ["zb-1.5b", "zb-6.2b", "zb-14.6b", "zb-28.3b", "llama2-7b", "llama2-13b",
          "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b", "deepseek-v3",
          "deepseek-v3-debug", "kimi-k2", "qwen3-235b-a22b", "qwen3-30b-a3b",
          "gpt-oss-120b"]  # fmt: skip
HARDWARE = ["a100-80gb", "h100-80gb", "h100-96gb-500w", "h200", "cpu"]
STACKS = ["torchtitan", "torchtitan-2412", "megatron-core", "automodel"]


def test_bundled_cards_are_all_there_and_load() -> None:
    cards = bundled_cards()
    assert sorted(cards["model"]) == sorted(MODELS)
    assert sorted(cards["hardware"]) == sorted(HARDWARE)
    assert sorted(cards["stack"]) == sorted(f"stack-{n}" for n in STACKS)
    for name in MODELS:
        assert load_model_card(name).name == name
    for name in HARDWARE:
        assert load_hardware_card(name).name == name


def _params(name: str, *, tied: bool) -> float:
    card = load_model_card(name)
    total = card.layers * layer_params(card) + embedding_params(card)
    return total if tied else total + head_params(card)


@pytest.mark.parametrize(
    ("name", "billions", "tied"),
    [
        ("zb-1.5b", 1.5, True),  # Megatron GPT ties the output layer to the embedding
        ("zb-6.2b", 6.2, True),
        ("zb-14.6b", 14.6, True),
        ("zb-28.3b", 28.3, True),
        ("llama2-7b", 6.74, False),  # published parameter counts (HF model cards)
        ("llama2-13b", 13.02, False),
        ("llama2-70b", 68.98, False),
        ("llama3-8b", 8.03, False),
        ("llama3-70b", 70.55, False),
        ("llama3.1-405b", 405.85, False),  # 405,853,388,800 (HF meta-llama/Llama-3.1-405B)
    ],
)
def test_parameter_counts_match_the_model_names(name: str, billions: float, tied: bool) -> None:
    assert _params(name, tied=tied) / 1e9 == pytest.approx(billions, rel=0.03)


def test_405b_profiles_on_16_stages_of_8_way_tensor_parallel_h100s() -> None:
    # torchtitan's 405B benchmark shape on 128 H100s: TP 8 inside a node, PP 16 across;
    # 126 layers do not split evenly into 16, so the two ends take one layer less.
    from pp_opt.profiler import profile_costs

    layers = [7] + [8] * 14 + [7]
    costs = profile_costs(model="llama3.1-405b", hardware="h100-80gb", pp=16, tp=8,
                          microbatches=32, layers=layers)  # fmt: skip
    stages = costs["profile"]["stages"]
    assert [s["layers"] for s in stages] == layers
    assert stages[0]["embedding"] and stages[-1]["head"]
    # Per-rank parameters of the stages, times the tensor-parallel degree: the whole model.
    assert sum(s["params"] for s in stages) * 8 == pytest.approx(405.85e9, rel=0.02)
    assert len(costs["stages"]) == 16 and all(st["t_f"] > 0 for st in costs["stages"])


def test_gqa_and_ffn_sizes() -> None:
    card = load_model_card("llama2-70b")
    assert card.num_kv_heads == 8 and card.kv_hidden == 1024 and card.ffn_size == 28672
    gpt = load_model_card("zb-1.5b")
    assert gpt.num_kv_heads == gpt.heads and gpt.ffn_size == 4 * gpt.hidden


def test_unknown_card_key_is_a_one_line_error() -> None:
    base = dict(layers=2, hidden=64, heads=4, vocab=100, seq=32)
    with pytest.raises(ProblemError, match=r"model\.hiden: unknown key; allowed keys are"):
        model_card_from_dict({**base, "hiden": 64})
    with pytest.raises(ProblemError, match=r"model\.vocab: missing"):
        model_card_from_dict({k: v for k, v in base.items() if k != "vocab"})
    with pytest.raises(ProblemError, match=r"model\.mlp: unknown 'relu'"):
        model_card_from_dict({**base, "mlp": "relu"})
    with pytest.raises(ProblemError, match=r"model\.kv_heads: 3 does not divide heads 4"):
        model_card_from_dict({**base, "kv_heads": 3})
    hw = load_hardware_card("a100-80gb").to_dict()
    del hw["name"]
    with pytest.raises(ProblemError, match=r"hardware\.peak_tflop: unknown key"):
        hardware_card_from_dict({**hw, "peak_tflop": 1.0})
    with pytest.raises(ProblemError, match=r"hardware\.gemm_efficiency: is a fraction"):
        hardware_card_from_dict({**hw, "gemm_efficiency": 78})


def test_card_files_by_path_and_bad_names(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('layers = 2\nhidden = 64\nheads = 4\nvocab = 100\nseq = 32\ncolour = "red"\n')
    with pytest.raises(ProblemError, match=r"model\.colour: unknown key"):
        load_model_card(path)
    path.write_text("layers = 2\nhidden = 64\nheads = 4\nvocab = 100\nseq = 32\n")
    assert load_model_card(path).name == "mine"
    with pytest.raises(ProblemError, match="no such card file; give a .toml path or one of"):
        load_model_card("llama9-1t")


def test_hardware_numbers_are_consistent() -> None:
    a100, h100, h200 = (load_hardware_card(n) for n in ("a100-80gb", "h100-80gb", "h200"))
    assert a100.d2h_gbs == 15.0 and h100.d2h_gbs == 21.0  # docs/design.md §7
    assert h200.hbm_gib > h100.hbm_gib == a100.hbm_gib == 80.0
    assert h200.hbm_gbs > h100.hbm_gbs > a100.hbm_gbs
    assert a100.cap_bytes == (80.0 - a100.reserve_gib) * 2**30
