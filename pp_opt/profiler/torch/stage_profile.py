"""Time every pipeline stage's F, I, W and B as the runtime runs them, alone or all at once.

Per stage, each repeat keeps two microbatches in flight, as a pipeline does: the forwards of
both, then the split backward's ``I`` of one and the fused ``B`` of the other, and last the
deferred ``W`` of the first; even repeats start with the split microbatch, odd ones with the
fused one, so neither always runs on a warmer cache. Stages of one device are
interleaved repeat by repeat, as a pipeline interleaves them. Each op's samples give median,
interquartile range, min and max (:func:`timing_stats`); the costs use the median.

``concurrent=True`` runs one process per device, all timing their own stages at the same
time, as the pipeline's ranks do: memory bandwidth, caches and (on a small CPU) cores are then
shared as they will be in the run. A process that finishes its timed repeats keeps running
untimed ones until every process has finished, so no sample is taken on a quieter machine.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pp_opt.profiler.cards import ModelCard
from pp_opt.profiler.torch.model import TORCH_DTYPES, lm_loss, make_stage
from pp_opt.profiler.torch.stage_ops import StageRunner, saved_bytes, timed
from pp_opt.profiler.torch.timing_stats import timing_stats

log = logging.getLogger(__name__)

OPS = ("f", "i", "w", "b")
"""Timed ops: forward, backward-input (our B), backward-weight (W), fused backward (BW)."""
WORKER_TIMEOUT_S = 1800.0


def stage_runner(
    card: ModelCard,
    layers: Sequence[int],
    stage: int,
    *,
    mbs: int,
    seq: int,
    device: torch.device,
    dtype: str,
    seed: int = 0,
) -> StageRunner:
    """A :class:`StageRunner` for stage ``stage`` of ``card`` split as ``layers``."""
    module = make_stage(card, layers, stage, device=device, dtype=dtype, seed=seed)
    first, last = stage == 0, stage == len(layers) - 1
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, card.vocab, (mbs, seq), generator=gen).to(device)
    shape = (mbs, seq, card.hidden)
    torch_dtype = TORCH_DTYPES[dtype]

    def make_input() -> torch.Tensor:
        if first:
            return ids
        return torch.randn(shape, device=device, dtype=torch_dtype, requires_grad=True)

    return StageRunner(module, make_input, first, last, loss_fn=lm_loss, target=ids)


def _one_repeat(runner: StageRunner, device: torch.device, split_first: bool) -> dict[str, float]:
    """Two microbatches in flight, as in a pipeline: both forwards, then ``I`` of one and the
    fused ``B`` of the other, then the deferred ``W`` of the first (its saved tensors no longer
    fresh in cache, as when a schedule runs ``W`` late)."""
    split, fused = runner, runner.twin()
    out: dict[str, float] = {}

    def forward(r: StageRunner, key: str) -> None:
        r.receive_input()
        out[key] = timed(device, r.forward)

    def backward(r: StageRunner, key: str, fn: Callable[[], None]) -> None:
        r.receive_grad()
        out[key] = timed(device, fn)

    forwards = [(split, "f"), (fused, "f2")]
    backwards = [(split, "i", split.backward_input), (fused, "b", fused.backward_full)]
    order = (0, 1) if split_first else (1, 0)
    for i in order:
        forward(*forwards[i])
    for i in order:
        backward(*backwards[i])
    out["w"] = timed(device, split.backward_weight)
    return out


class Peers:
    """How the processes of a concurrent profile start together and stop together."""

    def ready(self) -> None:
        """Wait until every process has warmed up."""
        raise NotImplementedError

    def finished(self) -> None:
        """Say this process has all its samples."""
        raise NotImplementedError

    def busy(self) -> bool:
        """True while some process still takes samples."""
        raise NotImplementedError


class ProcessPeers(Peers):
    """:class:`Peers` on a ``multiprocessing`` barrier and shared counter."""

    def __init__(self, barrier: Any, done: Any, p: int) -> None:
        self.barrier, self.done, self.p = barrier, done, p

    def ready(self) -> None:
        """Wait until every process has warmed up."""
        self.barrier.wait(timeout=WORKER_TIMEOUT_S)

    def finished(self) -> None:
        """Say this process has all its samples."""
        with self.done.get_lock():
            self.done.value += 1

    def busy(self) -> bool:
        """True while some process still takes samples."""
        return bool(self.done.value < self.p)


class GroupPeers(Peers):
    """:class:`Peers` for the ranks of the default ``torch.distributed`` group.

    ``key`` names the shared counter in the group's store; use a new one for each profile.
    """

    def __init__(self, key: str) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        self.key, self.p = key, dist.get_world_size()
        self.store = distributed_c10d._get_default_store()
        self._barrier = dist.barrier

    def ready(self) -> None:
        self._barrier()

    def finished(self) -> None:
        self.store.add(self.key, 1)

    def busy(self) -> bool:
        return bool(self.store.add(self.key, 0) < self.p)


def time_stages(
    runners: dict[int, StageRunner],
    *,
    device: torch.device,
    repeats: int,
    warmup: int,
    peers: Peers | None = None,
) -> dict[int, dict[str, Any]]:
    """Time F, I, W, B of each runner ``repeats`` times after ``warmup`` untimed repeats.

    With ``peers`` (concurrent mode) timing starts when every process is warm, and untimed
    repeats go on until every process has its samples.
    """
    samples: dict[int, dict[str, list[float]]] = {s: {k: [] for k in OPS} for s in runners}
    ratios: dict[int, list[float]] = {s: [] for s in runners}
    for rep in range(-warmup, repeats):
        if rep == 0 and peers is not None:
            peers.ready()
        for s, runner in runners.items():
            got = _one_repeat(runner, device, split_first=rep % 2 == 0)
            if rep >= 0:
                for key in OPS:
                    samples[s][key].append(got[key])
                samples[s]["f"].append(got["f2"])
                ratios[s].append((got["i"] + got["w"]) / got["b"])
    if peers is not None:
        peers.finished()
        while peers.busy():
            for runner in runners.values():
                _one_repeat(runner, device, split_first=True)
    out: dict[int, dict[str, Any]] = {}
    for s, runner in runners.items():
        out[s] = {key: timing_stats(samples[s][key]) for key in OPS}
        # (I + W) / B within each repeat: runs close in time share their noise.
        out[s]["split_over_fused"] = timing_stats(ratios[s])
        out[s].update(saved_bytes(runner))
        for p in runner.module.parameters():
            p.grad = None
    return out


def measure_stages(
    card: ModelCard,
    layers: Sequence[int],
    stages: Sequence[int],
    *,
    mbs: int,
    seq: int,
    device: torch.device,
    dtype: str,
    repeats: int,
    warmup: int,
    seed: int = 0,
    peers: Peers | None = None,
) -> dict[int, dict[str, Any]]:
    """Build ``stages`` (those of one device) and time them; see :func:`time_stages`."""
    runners = {
        s: stage_runner(card, layers, s, mbs=mbs, seq=seq, device=device, dtype=dtype, seed=seed)
        for s in stages
    }
    return time_stages(runners, device=device, repeats=repeats, warmup=warmup, peers=peers)


def _device_for(device: torch.device, d: int) -> torch.device:
    """Device ``d``'s own GPU when there are enough, else a shared one; CPU stays CPU."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", d % max(1, torch.cuda.device_count()))


def _worker(d: int, job: dict[str, Any], peers: ProcessPeers, results: Any) -> None:
    """One device's process in concurrent mode: time its stages while the others time theirs."""
    try:
        if job["threads"] is not None:
            torch.set_num_threads(job["threads"])
        device = _device_for(torch.device(job["device"]), d)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        out = measure_stages(
            job["card"], job["layers"], job["stages"][d], mbs=job["mbs"], seq=job["seq"],
            device=device, dtype=job["dtype"], repeats=job["repeats"], warmup=job["warmup"],
            seed=job["seed"], peers=peers,
        )  # fmt: skip
        link = _link(d, job, device) if job["link_port"] else None
        results.put((d, out, link, None))
    except BaseException as err:  # noqa: BLE001 - sent to the parent, which raises it
        peers.barrier.abort()
        peers.finished()
        results.put((d, None, None, f"{type(err).__name__}: {err}"))


def _link(d: int, job: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``t_comm`` as the runtime's sends see it, between this device and its neighbours."""
    import torch.distributed as dist

    from pp_opt.profiler.torch.link import neighbour_latency

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{job['link_port']}",
                            rank=d, world_size=len(job["stages"]))  # fmt: skip
    try:
        shape = (job["mbs"], job["seq"], job["card"].hidden)
        return neighbour_latency(shape, TORCH_DTYPES[job["dtype"]], device)
    finally:
        dist.destroy_process_group()


def measure_concurrently(
    card: ModelCard,
    layers: Sequence[int],
    stages_by_device: Sequence[Sequence[int]],
    *,
    mbs: int,
    seq: int,
    device: torch.device,
    dtype: str,
    repeats: int,
    warmup: int,
    threads: int | None,
    seed: int = 0,
) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """Time every device's stages in its own process, all processes at the same time.

    Processes are forked on CPU (they inherit the imported torch) and spawned on CUDA. Then
    the processes form a process group (gloo on CPU, NCCL when each has its own GPU) and
    time one activation message between neighbours (:mod:`pp_opt.profiler.torch.link`). Returns
    the stage measurements and the link measurement (None when it cannot be made here).
    """
    p = len(stages_by_device)
    method = (
        "spawn" if device.type == "cuda" or "fork" not in mp.get_all_start_methods() else "fork"
    )
    ctx: Any = mp.get_context(method)
    peers = ProcessPeers(ctx.Barrier(p), ctx.Value("i", 0), p)
    results = ctx.Queue()
    job = {"card": card, "layers": list(layers), "stages": [list(s) for s in stages_by_device],
           "mbs": mbs, "seq": seq, "device": str(device), "dtype": dtype, "repeats": repeats,
           "warmup": warmup, "threads": threads, "seed": seed,
           "link_port": _link_port(device, p)}  # fmt: skip
    procs = [ctx.Process(target=_worker, args=(d, job, peers, results)) for d in range(p)]
    for proc in procs:
        proc.start()
    out: dict[int, dict[str, Any]] = {}
    link = None
    errors = []
    try:
        for _ in range(p):
            d, got, link_got, error = results.get(timeout=WORKER_TIMEOUT_S)
            if error is not None:
                errors.append(f"device {d}: {error}")
            else:
                out.update(got)
                link = link_got if d == 0 else link
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
    if errors:
        raise RuntimeError("concurrent profile failed: " + "; ".join(errors))
    log.info("timed %d stages on %d concurrent processes (%s)", len(out), p, method)
    return out, link


def _link_port(device: torch.device, p: int) -> int | None:
    """A free local port for the link measurement, or None where it cannot run."""
    import socket

    if p < 2 or (device.type == "cuda" and torch.cuda.device_count() < p):
        return None  # NCCL needs one GPU per process
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
