"""Benchmark the cost profiler on every bundled model card at a standard layout.

Prints, per model card and hardware card, the analytic costs of a plain (middle) stage, and
for the Zero Bubble models the paper's A100 profile next to them. Where a CUDA device is
present it also measures one decoder layer of each card with PyTorch and prints the analytic
layer costs next to the measured ones; on CPU it measures small stand-ins of a GPT-style and
a Llama-style card instead (times then say nothing about a GPU; the bytes and the B + W
versus full backward check still hold). Everything goes to a JSON file as well.

    .venv/bin/python scripts/bench_profiler.py [-o bench_profiler.json] [--repeats 10]
    .venv/bin/python scripts/bench_profiler.py --no-measure --markdown analytic.md   # the docs
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pp_opt.errors import PPOptError
from pp_opt.profiler import load_hardware_card, load_model_card, profile_costs
from pp_opt.profiler.analytic import layer_times
from pp_opt.profiler.cards import bundled_cards, model_card_from_dict
from pp_opt.profiler.formulas import LayerShape, layer_activation_bytes
from pp_opt.profiler.layer_split import suggest_split

# Standard layouts: the Zero Bubble paper's for its models (p, m, microbatch size), and a
# common one for the Llama cards (8 GPUs of pipeline, tensor parallel for the 70B models).
STANDARD: dict[str, dict[str, int]] = {
    "zb-1.5b": dict(pp=8, microbatches=24, mbs=6),
    "zb-6.2b": dict(pp=8, microbatches=24, mbs=3),
    "zb-14.6b": dict(pp=16, microbatches=48, mbs=1),
    "zb-28.3b": dict(pp=32, microbatches=96, mbs=1),
    "llama2-7b": dict(pp=4, microbatches=16, mbs=1),
    "llama2-13b": dict(pp=8, microbatches=32, mbs=1),
    "llama2-70b": dict(pp=8, microbatches=32, mbs=1, tp=4),
    "llama3-8b": dict(pp=4, microbatches=16, mbs=1),
    "llama3-70b": dict(pp=8, microbatches=32, mbs=1, tp=4),
}
PAPER = {  # docs/design.md §7, A100 (ms)
    "zb-1.5b": (18.52, 18.09, 9.34),
    "zb-6.2b": (29.72, 29.44, 19.93),
    "zb-14.6b": (11.35, 11.25, 8.13),
    "zb-28.3b": (10.42, 10.21, 7.72),
}
GIB = 2**30


def analytic_rows() -> list[dict[str, Any]]:
    rows = []
    gpus = [hw for hw in bundled_cards()["hardware"] if hw != "cpu"]  # sized for a CPU run
    for hw in gpus:
        for name in bundled_cards()["model"]:
            layout = dict(STANDARD.get(name, dict(pp=4, microbatches=16)))
            card = load_model_card(name)
            stages = layout["pp"] * layout.get("v", 1)
            layout["layers"] = suggest_split(card.layers, stages)
            try:
                data = profile_costs(model=name, hardware=hw, **layout)
            except PPOptError as err:  # a card too large for this layout (llama3.1-405b)
                print(f"skipped {name} on {hw}: {err}")
                continue
            mid = data["stages"][len(data["stages"]) // 2]
            row = {"model": name, "hardware": hw, "layout": layout, "middle_stage": mid,
                   "t_comm": data["t_comm"],
                   "static_gib": max(d["static"] for d in data["devices"]) / GIB}  # fmt: skip
            if hw == "a100-80gb" and name in PAPER:
                row["paper"] = dict(zip(("t_f", "t_b", "t_w"), PAPER[name], strict=True))
            rows.append(row)
    return rows


def print_analytic(rows: list[dict[str, Any]]) -> None:
    print("analytic costs of a middle stage (ms, GiB); paper = Zero Bubble A100 profile")
    print(f"{'model':<11} {'hardware':<10} {'layout':<22} {'t_f':>7} {'t_b':>7} {'t_w':>7} "
          f"{'m_b':>6} {'m_w':>6} {'static':>6} {'t_comm':>6}  paper t_f/t_b/t_w")  # fmt: skip
    for r in rows:
        mid, lay = r["middle_stage"], r["layout"]
        shape = f"pp{lay['pp']} tp{lay.get('tp', 1)} b{lay.get('mbs', 1)} m{lay['microbatches']}"
        paper = r.get("paper")
        ref = f"  {paper['t_f']}/{paper['t_b']}/{paper['t_w']}" if paper else ""
        times = f"{mid['t_f']:7.2f} {mid['t_b']:7.2f} {mid['t_w']:7.2f}"
        memory = f"{mid['m_b'] / GIB:6.2f} {mid['m_w'] / GIB:6.2f} {r['static_gib']:6.1f}"
        print(f"{r['model']:<11} {r['hardware']:<10} {shape:<22} {times} {memory} "
              f"{r['t_comm']:6.3f}{ref}")  # fmt: skip


def measured_rows(repeats: int) -> list[dict[str, Any]]:
    import torch

    from pp_opt.profiler.torch.measured import measure_layers

    if torch.cuda.is_available():
        hw = load_hardware_card(_hardware_for(torch.cuda.get_device_name()))
        cases = []
        for name in bundled_cards()["model"]:
            lay = STANDARD.get(name, {})
            cases.append((load_model_card(name), load_model_card(name).seq, lay.get("mbs", 1)))
    else:
        hw = load_hardware_card("a100-80gb")
        torch.set_num_threads(1)
        small = dict(layers=4, hidden=256, heads=4, vocab=512, seq=128, dtype="fp32")
        cases = [
            (model_card_from_dict({**small, "dropout": 0.1}, "tiny-gpt"), 128, 2),
            (model_card_from_dict({**small, "kv_heads": 2, "mlp": "swiglu", "norm": "rmsnorm",
                                   "attention": "flash", "bias": False}, "tiny-llama"), 128, 2),
        ]  # fmt: skip
    rows = []
    for card, seq, mbs in cases:
        start = time.perf_counter()
        meas = measure_layers(card, seq=seq, mbs=mbs, repeats=repeats, head=False)
        used = replace(card, dtype=meas["dtype"])
        shape = LayerShape.of(used, s=seq, b=mbs)
        t_f, t_b, t_w = layer_times(shape, hw)
        m_b, m_w = layer_activation_bytes(shape)
        layer = meas["layer"]
        rows.append({
            "model": card.name, "seq": seq, "mbs": mbs, "hardware_card": hw.name,
            "environment": meas["environment"], "copy_gbs": meas["copy"],
            "analytic": {"t_f": t_f, "t_b": t_b, "t_w": t_w, "m_b": m_b, "m_w": m_w},
            "measured": {"t_f": layer["f"], "t_b": layer["b"], "t_w": layer["w"],
                         "t_full_backward": layer["full"], "m_b": layer["m_b"],
                         "m_w": layer["m_w_raw"], "split_over_full": layer["split_over_full"],
                         "peak_forward_bytes": layer.get("peak_forward_bytes")},
            "seconds": time.perf_counter() - start,
        })  # fmt: skip
    return rows


def _hardware_for(device_name: str) -> str:
    lowered = device_name.lower()
    return "h200" if "h200" in lowered else "h100-80gb" if "h100" in lowered else "a100-80gb"


def print_measured(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    env = rows[0]["environment"]
    print(f"\none layer, analytic ({rows[0]['hardware_card']} card) vs measured on "
          f"{env['device_name']} ({env['device']}, torch {env['torch']}, {env['threads']} "
          f"threads, {env['dtype']}); times ms (median, iqr), bytes MiB")  # fmt: skip
    for r in rows:
        a, m = r["analytic"], r["measured"]
        times = " ".join(
            f"{k} {a[k]:.3f}/{m[k]['median']:.3f}(+-{m[k]['iqr']:.3f})"
            for k in ("t_f", "t_b", "t_w")
        )
        mib = 2**20
        memory = (f"m_b {a['m_b'] / mib:.2f}/{m['m_b'] / mib:.2f}, "
                  f"m_w {a['m_w'] / mib:.2f}/{m['m_w'] / mib:.2f}")  # fmt: skip
        print(f"{r['model']:<12} s{r['seq']} b{r['mbs']}: {times}; full bwd "
              f"{m['t_full_backward']['median']:.3f}, (t_b+t_w)/full "
              f"{m['split_over_full']['median']:.3f}; {memory}")  # fmt: skip
        if r["copy_gbs"]:
            print(f"{'':<12} pinned copies: d2h {r['copy_gbs']['d2h_gbs']:.1f} GB/s, "
                  f"h2d {r['copy_gbs']['h2d_gbs']:.1f} GB/s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=Path("bench_profiler.json"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-measure", action="store_true", help="analytic only")
    parser.add_argument("--markdown", type=Path, help="Write the analytic table as Markdown.")
    args = parser.parse_args()
    rows = analytic_rows()
    print_analytic(rows)
    measured: list[dict[str, Any]] = []
    if not args.no_measure:
        try:
            measured = measured_rows(args.repeats)
        except ImportError:
            print("\n(torch is not installed: no measured comparison)")
    print_measured(measured)
    args.output.write_text(json.dumps({"analytic": rows, "measured": measured}, indent=1) + "\n")
    print(f"\nwrote {args.output}")
    if args.markdown:
        write_markdown(args.markdown, rows)


def write_markdown(path: Path, rows: list[dict[str, Any]]) -> None:
    """The analytic costs of a middle stage as the docs show them (ms and GiB)."""
    from bench_markdown import fixed, table, text, write

    shown = []
    for r in rows:
        mid, lay, paper = r["middle_stage"], r["layout"], r.get("paper")
        shown.append({
            "model": r["model"], "hardware": r["hardware"],
            "layout": (f"pp{lay['pp']} tp{lay.get('tp', 1)} mbs{lay.get('mbs', 1)} "
                       f"m{lay['microbatches']}"),
            "t_f": mid["t_f"], "t_b": mid["t_b"], "t_w": mid["t_w"],
            "m_b": mid["m_b"] / GIB, "m_w": mid["m_w"] / GIB, "static": r["static_gib"],
            "paper": f"{paper['t_f']} / {paper['t_b']} / {paper['t_w']}" if paper else None,
        })  # fmt: skip
    columns = [("model", "model", text), ("hardware", "hardware", text),
               ("layout", "layout", text), ("t_f", "t_f ms", fixed(2)),
               ("t_b", "t_b ms", fixed(2)), ("t_w", "t_w ms", fixed(2)),
               ("m_b", "m_b GiB", fixed(2)), ("m_w", "m_w GiB", fixed(2)),
               ("static", "static GiB", fixed(1)),
               ("paper", "Zero Bubble paper t_f / t_b / t_w", text)]  # fmt: skip
    write(path, [("", table(shown, columns))])


if __name__ == "__main__":
    main()
