"""Measured profiler, per stage: the ops PyTorch's pipeline runtime runs, alone or all at once."""

from __future__ import annotations

import pytest

from pp_opt.errors import ProblemError
from pp_opt.profiler.cards import load_hardware_card, model_card_from_dict

torch = pytest.importorskip("torch", reason="measured profiles need PyTorch (the torch extra)")

from torch.distributed.pipelining import _backward  # noqa: E402

from pp_opt.profiler import profile_costs  # noqa: E402
from pp_opt.profiler.torch.stage_ops import saved_bytes  # noqa: E402
from pp_opt.profiler.torch.stage_profile import stage_runner, time_stages  # noqa: E402

CPU = torch.device("cpu")
TINY = dict(layers=2, hidden=32, heads=2, vocab=64, seq=16, dtype="fp32")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def spies(monkeypatch):
    """Count calls of PyTorch's backward helpers, which the profiler must go through."""
    calls: list[str] = []
    for name in ("stage_backward_input", "stage_backward_weight", "stage_backward"):
        original = getattr(_backward, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(_backward, name, spy)
    return calls


def _runner(stage: int, stages: int = 3):
    """Stage ``stage`` of a ``stages``-layer decoder split one layer per stage."""
    card = model_card_from_dict({**TINY, "layers": stages}, "tiny")
    return stage_runner(card, [1] * stages, stage, mbs=1, seq=16, device=CPU, dtype="fp32")


@pytest.mark.parametrize(
    ("stage", "split", "fused"),
    [
        (0, ["stage_backward"], ["stage_backward"]),  # first: I is a no-op, W the whole backward
        (1, ["stage_backward_input", "stage_backward_weight"], ["stage_backward"]),
        (2, ["stage_backward_input", "stage_backward_weight"], ["stage_backward"]),  # loss
    ],
    ids=["first", "middle", "last"],
)
def test_i_and_w_go_through_pytorchs_own_split(spies, stage, split, fused) -> None:
    runner = _runner(stage)
    runner.forward()
    runner.backward_input()
    runner.backward_weight()
    assert spies == split
    spies.clear()
    runner.forward()
    runner.backward_full()
    assert spies == fused
    assert all(p.grad is not None for p in runner.module.parameters())


def test_split_and_fused_backward_give_the_same_gradients() -> None:
    runner = _runner(1)
    torch.manual_seed(0)
    runner.forward()
    runner.backward_input()
    runner.backward_weight()
    split = [p.grad.clone() for p in runner.module.parameters()]
    for p in runner.module.parameters():
        p.grad = None
    torch.manual_seed(0)
    runner.forward()
    runner.backward_full()
    for a, p in zip(split, runner.module.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)


def test_spread_is_reported_per_op_and_sane() -> None:
    runners = {s: _runner(s, stages=2) for s in (0, 1)}
    out = time_stages(runners, device=CPU, repeats=5, warmup=1)
    for s in (0, 1):
        for op in ("f", "i", "w", "b"):
            st = out[s][op]
            assert st["repeats"] == (10 if op == "f" else 5)  # two forwards per repeat
            assert 0.0 <= st["min"] <= st["median"] <= st["max"]
            assert 0.0 <= st["iqr"] <= st["max"] - st["min"]
        assert out[s]["split_over_fused"]["repeats"] == 5
    assert out[0]["i"]["median"] < out[0]["w"]["median"]


def test_pytorch_keeps_the_graph_from_i_to_w() -> None:
    """``m_w``: retain_graph=True in I keeps almost everything F saved until W."""
    got = saved_bytes(_runner(1))
    assert 0.5 * got["m_b"] < got["m_w"] <= got["m_b"]


def test_concurrent_profile_runs_every_device_at_once() -> None:
    card = model_card_from_dict(TINY, "tiny")
    data = profile_costs(model=card, pp=2, microbatches=4, measure=True, repeats=2, warmup=1,
                         concurrent=True, threads=1)  # fmt: skip
    prof = data["profile"]
    assert prof["measurements"]["mode"] == "concurrent" and prof["environment"]["concurrent"]
    assert prof["hardware"]["name"] == "cpu"  # no card given, measured on a CPU
    for row, det in zip(data["stages"], prof["stages"], strict=True):
        assert row["t_f"] > 0 and det["timings"]["t_bw"]["repeats"] == 2
    link = prof["measurements"]["link"]  # an activation sent between the two processes
    assert len(link["pairs"]) == 1 and data["t_comm"] == link["t_comm"] > 0


def test_cpu_card_and_hardware_defaults() -> None:
    cpu = load_hardware_card("cpu")
    assert cpu.name == "cpu" and cpu.cap_bytes == (cpu.hbm_gib - cpu.reserve_gib) * 2**30
    assert cpu.intra_node_latency_us > 10 and cpu.intra_node_gbs < 10  # gloo, not NVLink
    card = model_card_from_dict(TINY, "tiny")
    with pytest.raises(ProblemError, match=r"^hardware: no hardware card; give one"):
        profile_costs(model=card, pp=2, microbatches=4)
    with pytest.raises(ProblemError, match=r"^repeats: got 0"):
        profile_costs(model=card, pp=2, microbatches=4, measure=True, repeats=0)
