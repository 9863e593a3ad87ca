"""Measured stage costs: time and weigh one decoder layer (and the output head) with PyTorch.

Per microbatch, on CUDA when present, else CPU: forward time; B, the gradient w.r.t. the
layer input (and the norm weights; linear weight gradients deferred, see torch_blocks.py);
W, the deferred linear weight and bias gradients; and, as a check, an ordinary full
backward. Activation bytes are what autograd keeps from F to B (saved-tensor hooks,
distinct storages, parameters excluded); ``m_w`` is what the deferred store holds from B to
W. Each time is the median of ``repeats`` runs after ``warmup`` runs, reported with its min,
max and interquartile range. On CUDA, peak memory of a forward and pinned device-to-host /
host-to-device bandwidth are measured too; on CPU the copy bandwidths stay those of the
hardware card.

A stage's costs are its layer count times the layer's, plus the head on the last stage and
the (analytic, tiny) embedding on the first; static memory, caps and links stay analytic.
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.profiler.analytic import StageCost, embedding_costs
from pp_opt.profiler.cards import DTYPE_BYTES, HardwareCard, ModelCard
from pp_opt.profiler.layout import Layout

try:
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

TORCH_HINT = (
    "install it with `pip install torch==2.13.0` (a CPU build is enough) "
    "or the extra: `pip install pp-opt[torch]`"
)


def require_torch() -> Any:
    """The torch module, or a one-line ProblemError saying how to install it."""
    if torch is None:
        raise ProblemError("measure", f"measured profiles need PyTorch; {TORCH_HINT}")
    return torch


def _sync(device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timing_stats(samples: list[float]) -> dict[str, float]:
    """Median, min, max and interquartile range of timings (ms)."""
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "iqr": q[2] - q[0], "repeats": len(ordered)}  # fmt: skip


def _timed(device: Any, setup: Callable[[], Any], run: Callable[[Any], Any]) -> float:
    state = setup()
    _sync(device)
    start = time.perf_counter()
    run(state)
    _sync(device)
    return 1e3 * (time.perf_counter() - start)


def saved_activation_bytes(module: Any, inputs: tuple[Any, ...]) -> tuple[int, Any]:
    """Bytes of distinct storages autograd keeps from one forward (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*inputs)
    return sum(seen.values()), out


def measure_module(
    module: Any, make_inputs: Callable[[], tuple[Any, ...]], *, repeats: int, warmup: int
) -> dict[str, Any]:
    """Time F, B, W and a full backward of ``module`` and weigh what F and B keep.

    ``make_inputs`` returns the module's inputs; the first one is the activation that B
    differentiates with respect to. The module output is a tensor (then a random output
    gradient is used) or a scalar loss.
    """
    from pp_opt.profiler.torch_blocks import WeightGradStore

    device = next(module.parameters()).device
    params = [p for p in module.parameters() if p.requires_grad]
    # B also computes the small gradients of norm weights (as Zero Bubble does); W defers only
    # the linear layers' weights and biases.
    deferred = {id(p) for m in module.modules() if isinstance(m, torch.nn.Linear)
                for p in m.parameters()}  # fmt: skip
    in_b = [p for p in params if id(p) not in deferred]

    def forward() -> tuple[Any, Any, Any]:
        inputs = make_inputs()
        out = module(*inputs)
        grad = torch.randn_like(out) if out.dim() else None
        return inputs, out, grad

    def backward_input(state: Any) -> None:
        inputs, out, grad = state
        torch.autograd.grad(out, [inputs[0], *in_b], grad)

    def full_backward(state: Any) -> None:
        inputs, out, grad = state
        torch.autograd.grad(out, [inputs[0], *params], grad)

    store = WeightGradStore()
    samples: dict[str, list[float]] = {"f": [], "b": [], "w": [], "full": []}
    for i in range(warmup + repeats):
        keep = i >= warmup
        module.store = None
        t = _timed(device, make_inputs, lambda inputs: module(*inputs))
        t_full = _timed(device, forward, full_backward)
        module.store = store
        t_b = _timed(device, forward, backward_input)
        t_w = _timed(device, lambda: None, lambda _: store.flush())
        for p in params:
            p.grad = None
        if keep:
            for key, value in zip(("f", "b", "w", "full"), (t, t_b, t_w, t_full), strict=True):
                samples[key].append(value)
    m_b, _ = saved_activation_bytes(module, make_inputs())
    module.store = store
    backward_input(forward())
    m_w = store.saved_bytes()
    store.items.clear()
    module.store = None
    result: dict[str, Any] = {k: timing_stats(v) for k, v in samples.items()}
    # (t_b + t_w) / full backward within each repeat: runs close in time share their noise.
    runs = zip(samples["b"], samples["w"], samples["full"], strict=True)
    paired = [(b + w) / full for b, w, full in runs]
    result["split_over_full"] = timing_stats(paired)
    result.update(m_b=float(m_b), m_w=float(min(m_w, m_b)), m_w_raw=float(m_w))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        module(*make_inputs())
        result["peak_forward_bytes"] = float(torch.cuda.max_memory_allocated(device) - base)
    return result


def copy_bandwidth(device: Any, nbytes: int = 256 * 2**20, repeats: int = 5) -> dict[str, float]:
    """Pinned device-to-host and host-to-device copy bandwidth in GB/s (CUDA only)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for name, dst, src in (("d2h_gbs", host, gpu), ("h2d_gbs", gpu, host)):
        times = []
        for _ in range(repeats + 1):
            _sync(device)
            start = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            _sync(device)
            times.append(time.perf_counter() - start)
        out[name] = nbytes / statistics.median(times[1:]) / 1e9
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: Any, dtype: Any) -> dict[str, Any]:
    """Where a profile was measured: versions, device, threads, dtype."""
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": _cpu_name(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "dtype": str(dtype).removeprefix("torch."),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def measure_layers(
    card: ModelCard,
    *,
    seq: int,
    mbs: int,
    device: Any = None,
    dtype: str | None = None,
    repeats: int = 10,
    warmup: int = 2,
    head: bool = True,
    seed: int = 0,
    threads: int | None = None,
) -> dict[str, Any]:
    """Measure one decoder layer (and the output head) of ``card`` at ``seq`` and ``mbs``.

    ``dtype`` defaults to the card's on CUDA and to fp32 on CPU (where bf16 GEMMs are not
    representative of a GPU); the result says which was used. ``threads`` fixes torch's
    intra-op CPU threads for the measurement (restored afterwards).
    """
    require_torch()
    if threads is not None:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return measure_layers(card, seq=seq, mbs=mbs, device=device, dtype=dtype,
                                  repeats=repeats, warmup=warmup, head=head, seed=seed)  # fmt: skip
        finally:
            torch.set_num_threads(before)
    from pp_opt.profiler.torch_blocks import DecoderBlock, OutputHead

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (card.dtype if device.type == "cuda" else "fp32")
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    torch.manual_seed(seed)
    shape = (mbs, seq, card.hidden)

    def activation() -> tuple[Any, ...]:
        return (torch.randn(shape, device=device, dtype=torch_dtype, requires_grad=True),)

    block = DecoderBlock(card).to(device=device, dtype=torch_dtype).train()
    out: dict[str, Any] = {"layer": measure_module(block, activation, repeats=repeats,
                                                   warmup=warmup)}  # fmt: skip
    if head:
        lm = OutputHead(card).to(device=device, dtype=torch_dtype).train()
        targets = torch.randint(0, card.vocab, shape[:2], device=device)
        out["head"] = measure_module(
            lm, lambda: (*activation(), targets), repeats=repeats, warmup=warmup
        )
    out["environment"] = environment(device, torch_dtype)
    out["copy"] = copy_bandwidth(device) if device.type == "cuda" else None
    out["dtype"] = dtype
    return out


def measure_profile(
    card: ModelCard,
    hw: HardwareCard,
    layout: Layout,
    analytic: dict[str, Any],
    *,
    repeats: int = 10,
    warmup: int = 2,
    device: Any = None,
    dtype: str | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """The analytic profile with stage times and activation bytes replaced by measured ones."""
    require_torch()
    if layout.tp != 1:
        raise ProblemError("tp", "measured profiles time a whole layer on one GPU; use tp = 1")
    if layout.recompute != "none":
        raise ProblemError(
            "recompute", "measured profiles do not recompute; use recompute = 'none'"
        )
    meas = measure_layers(card, seq=layout.seq, mbs=layout.mbs, device=device, dtype=dtype,
                          repeats=repeats, warmup=warmup, threads=threads)  # fmt: skip
    used = replace(card, dtype=meas["dtype"])
    emb = embedding_costs(used, layout, hw)
    stages: list[StageCost] = []
    for old in analytic["stages"]:
        st = StageCost(device=old.device, layers=old.layers, params=old.params,
                       embedding=old.embedding, head=old.head)  # fmt: skip
        parts = [(old.layers, meas["layer"])] + ([(1, meas["head"])] if old.head else [])
        for count, m in parts:
            st.t_f += count * m["f"]["median"]
            st.t_b += count * m["b"]["median"]
            st.t_w += count * m["w"]["median"]
            st.m_b += count * m["m_b"]
            st.m_w += count * m["m_w"]
        if old.embedding:
            for key in ("t_f", "t_w", "m_b"):
                setattr(st, key, getattr(st, key) + emb[key])
        st.m_in = min(DTYPE_BYTES[meas["dtype"]] * layout.seq * layout.mbs * card.hidden, st.m_b)
        if old.embedding:
            st.m_in = min(8.0 * layout.seq * layout.mbs, st.m_b)
        stages.append(st)
    profile = dict(analytic, stages=stages, environment=meas["environment"], measurements=meas)
    if meas["copy"]:
        profile.update(meas["copy"])
    log.info("measured %s on %s", card.name, meas["environment"]["device_name"])
    return profile
