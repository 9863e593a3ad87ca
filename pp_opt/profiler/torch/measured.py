"""Measured stage costs: run each pipeline stage's ops with PyTorch and time them.

:func:`measure_profile` (what ``profile_costs(measure=True)`` uses) builds every stage
whole, as the runtime trains it (model.py: embedding on the first stage, output layer
on the last, the loss in the last stage's forward), and times the actions PyTorch's
pipeline runtime executes (stage_ops.py): ``F``; ``I`` and ``W`` through
``torch.distributed.pipelining._backward`` (the runtime's own split, which costs more than
a fused backward and puts the whole backward of the first stage in ``W``); and the fused
``B`` (``t_bw``). Each cost is the median of ``repeats`` runs after ``warmup`` runs, kept with
its interquartile range, min and max; ``concurrent=True`` times all devices' stages at once
(stage_profile.py), and then times an activation message between neighbouring processes
for ``t_comm`` (link.py). Activation bytes are what the forward keeps (saved tensors and the
stage output), ``m_w`` what PyTorch still holds after ``I``; OFFLOAD and RELOAD are timed
with the runtime's own offloader. On CUDA, pinned copy bandwidth is measured too. Static
memory, the cap (and ``t_comm`` unless measured) stay those of the hardware card.

:func:`measure_layers` times one decoder layer with the Zero Bubble split instead (linear
weight gradients deferred, blocks.py): a reference for the analytic formulas, not what
PyTorch's runtime runs.
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

from pp_opt.arguments import integer
from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.cards import DTYPE_BYTES, HardwareCard, ModelCard
from pp_opt.profiler.costs import CostProfile, StageCost
from pp_opt.profiler.torch.timing_stats import timing_stats

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
    from pp_opt.profiler.torch.blocks import WeightGradStore

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
    from pp_opt.profiler.torch.blocks import DecoderBlock, OutputHead
    from pp_opt.profiler.torch.model import TORCH_DTYPES

    device, dtype = _device_and_dtype(card, device, dtype)
    torch_dtype = TORCH_DTYPES[dtype]
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


def _device_and_dtype(card: ModelCard, device: Any, dtype: str | None) -> tuple[Any, str]:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return device, dtype or (card.dtype if device.type == "cuda" else "fp32")


def measure_profile(
    card: ModelCard,
    hw: HardwareCard,
    analytic: CostProfile,
    *,
    repeats: int = 10,
    warmup: int = 2,
    device: Any = None,
    dtype: str | None = None,
    threads: int | None = None,
    concurrent: bool = False,
) -> CostProfile:
    """The analytic profile with every stage's times, bytes and copy times measured.

    Each stage is built whole (embedding on the first, output layer on the last) and its F,
    I, W and B are run as PyTorch's pipeline runtime runs them (stage_ops.py), alone or with
    all devices at once (``concurrent``, stage_profile.py). Static memory, the cap and the
    links stay those of the hardware card.
    """
    require_torch()
    layout = analytic.job
    _check_measurable(layout, repeats=repeats, warmup=warmup)
    from pp_opt.profiler.torch.model import TORCH_DTYPES
    from pp_opt.profiler.torch.stage_ops import copy_times
    from pp_opt.profiler.torch.stage_profile import (
        measure_concurrently,
        measure_stages,
        stage_runner,
    )

    device, dtype = _device_and_dtype(card, device, dtype)
    devices = layout.stage_devices
    by_device = [[s for s, d in enumerate(devices) if d == dev] for dev in range(max(devices) + 1)]
    if concurrent and threads is None and device.type == "cpu":
        threads = max(1, (os.cpu_count() or 1) // len(by_device))
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        shape = dict(mbs=layout.mbs, seq=layout.seq, device=device, dtype=dtype)
        link = None
        if concurrent:
            meas, link = measure_concurrently(card, layout.layers, by_device, repeats=repeats,
                                              warmup=warmup, threads=threads, **shape)  # fmt: skip
        else:
            meas = {}
            for own in by_device:
                meas.update(measure_stages(card, layout.layers, own, repeats=repeats,
                                           warmup=warmup, **shape))  # fmt: skip
        for s in meas:
            meas[s]["copy"] = copy_times(stage_runner(card, layout.layers, s, **shape), device)
        env = environment(device, TORCH_DTYPES[dtype])
    finally:
        torch.set_num_threads(before)
    stages = [_stage_cost(old, meas[s], layout, card, dtype)
              for s, old in enumerate(analytic.stages)]  # fmt: skip
    env.update(threads=threads or before, concurrent=concurrent)
    measurements: dict[str, Any] = {"mode": "concurrent" if concurrent else "one stage at a time",
                    "repeats": repeats, "warmup": warmup,
                    "stages": [meas[s] for s in range(len(stages))]}  # fmt: skip
    links = analytic.links
    if link is not None:
        measurements["link"] = link
        links = replace(links, t_comm=link["t_comm"])
    if device.type == "cuda":
        bandwidth = copy_bandwidth(device)
        links = replace(links, d2h_gbs=bandwidth["d2h_gbs"], h2d_gbs=bandwidth["h2d_gbs"])
    log.info("measured %s on %s (%s)", card.name, env["device_name"], measurements["mode"])
    return replace(
        analytic,
        kind="measured",
        stages=tuple(stages),
        links=links,
        environment=env,
        measurements=measurements,
    )


def _check_measurable(layout: Job, *, repeats: int, warmup: int) -> None:
    """What a measured profile can time: a whole layer on one GPU, no recompute."""
    if layout.tp != 1:
        raise ProblemError("tp", "measured profiles time a whole layer on one GPU; use tp = 1")
    if layout.ac != "none":
        raise ProblemError(
            "recompute", "measured profiles do not recompute; use recompute = 'none'"
        )
    integer("repeats", repeats, low=1)
    integer("warmup", warmup, low=0)


TIMING_KEYS = {"t_f": "f", "t_b": "i", "t_w": "w", "t_bw": "b"}
"""Cost field -> the runtime action timed for it (F, I, W, fused B)."""


def _stage_cost(
    old: StageCost, meas: dict[str, Any], layout: Job, card: ModelCard, dtype: str
) -> StageCost:
    times = {key: float(meas[op]["median"]) for key, op in TIMING_KEYS.items()}
    size = layout.seq * layout.mbs
    m_in = 8.0 * size if old.embedding else DTYPE_BYTES[dtype] * size * card.hidden
    return StageCost(
        device=old.device, layers=old.layers, params=old.params, embedding=old.embedding,
        head=old.head, **times, m_b=meas["m_b"], m_w=meas["m_w"], m_in=min(m_in, meas["m_b"]),
        t_offload=meas["copy"]["t_offload"], t_reload=meas["copy"]["t_reload"],
        timings={key: meas[op] for key, op in TIMING_KEYS.items()},
    )  # fmt: skip
