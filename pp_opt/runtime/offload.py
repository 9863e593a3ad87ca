"""Activation offload for pipeline stages: what PyTorch's pipeline runtime lacks.

The forward of an offloaded ``(stage, microbatch)`` runs under
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves is
packed into a :class:`SavedActivation` handle, so the autograd graph holds the
handle, not the tensor. ``OFFLOAD`` then copies the handles' tensors to host
memory (pinned, on CUDA, on a device-to-host stream) and drops the device
tensors; ``RELOAD`` copies them back (on a host-to-device stream) before the
backward unpacks them. Parameters and the stage's own inputs and outputs are
never moved: PyTorch's stage keeps references to those, so moving them would
free nothing.

On CPU, "host" and "device" are the same memory; the copies still happen (the
originals are released and replaced by new tensors), which makes the offload
observable: each :class:`OffloadEvent` says how many tensors moved, how many
originals were really freed, and where the backward found its tensors. As CUDA
copies run on their own streams, CPU copies run on two worker threads (one per
direction; torch releases the GIL while copying), so that they overlap compute as
the schedule assumes; the backward waits for its reload. With ``record=True`` each
copy is waited for before it is logged, so the log is exact (and copies do not
overlap compute).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

HOST = "host"
DEVICE = "device"


class SavedActivation:
    """A tensor autograd saved in a forward, where it lives now, and its pending copy."""

    __slots__ = ("tensor", "where", "ready", "moved", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.where = DEVICE
        self.ready: torch.cuda.Event | Future[None] | None = None
        """The reload's CUDA event, or its CPU copy job; the backward waits on it."""
        self.moved = False


@dataclass(kw_only=True, slots=True)
class OffloadEvent:
    """One step of the offload life of a (stage, microbatch)'s saved activations."""

    action: str
    """``offload``, ``reload`` or ``unpack`` (the backward read the tensors)."""
    stage: int
    microbatch: int
    tensors: int
    """Tensors moved (offload, reload) or read (unpack)."""
    nbytes: int
    locations: tuple[str, ...]
    """Where the tensors are after the action (``host`` / ``device``)."""
    freed: int = 0
    """Offload only: originals that no longer exist once released (really left the device)."""


class ActivationOffloader:
    """Saved-tensor store of one rank's stages; executes OFFLOAD and RELOAD actions.

    Parameters
    ----------
    device
        The device the stages compute on; copies use their own CUDA streams there.
    record
        Keep an :class:`OffloadEvent` log in ``events`` (the tests read it).
    """

    def __init__(self, device: torch.device, *, record: bool = False) -> None:
        self.device = torch.device(device)
        self.record = record
        self.events: list[OffloadEvent] = []
        self._saved: dict[tuple[int, int], list[weakref.ref[SavedActivation]]] = {}
        self._offloaded: dict[tuple[int, int], list[SavedActivation]] = {}
        self._copied: dict[tuple[int, int], torch.cuda.Event | Future[None]] = {}
        self._cuda = self.device.type == "cuda"
        self._d2h = torch.cuda.Stream(self.device) if self._cuda else None
        self._h2d = torch.cuda.Stream(self.device) if self._cuda else None
        self._cpu_copies: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None
        self._pending: list[Future[None]] = []
        self._unpacked: set[tuple[int, int]] = set()

    def reset(self) -> None:
        """Forget the last step's handles (called at the start of every step)."""
        self.wait_copies()
        self._saved.clear()
        self._offloaded.clear()
        self._copied.clear()
        self._unpacked.clear()

    @contextmanager
    def capture(self, stage: int, microbatch: int) -> Iterator[None]:
        """Run a forward whose saved tensors may be offloaded later."""
        handles = self._saved.setdefault((stage, microbatch), [])
        by_id: dict[int, SavedActivation] = {}

        def pack(tensor: torch.Tensor) -> SavedActivation:
            # A tensor saved twice (by two ops) gets one handle, so it is copied once.
            handle = by_id.get(id(tensor))
            if handle is None or handle.tensor is not tensor:
                handle = SavedActivation(tensor)
                by_id[id(tensor)] = handle
                handles.append(weakref.ref(handle))
            return handle

        def unpack(handle: SavedActivation) -> torch.Tensor:
            return self._unpack(stage, microbatch, handle)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def offload(
        self, stage: int, microbatch: int, *, fraction: float = 1.0, keep: set[int] | None = None
    ) -> None:
        """Move ``fraction`` of the saved bytes of ``(stage, microbatch)`` to host memory.

        ``keep`` holds storage pointers that stay put (parameters, stage inputs/outputs).
        """
        key = (stage, microbatch)
        handles = [h for ref in self._saved.get(key, []) if (h := ref()) is not None]
        keep = keep or set()
        movable = [h for h in handles if h.tensor.untyped_storage().data_ptr() not in keep]
        chosen = _first_bytes(movable, fraction)
        originals = [weakref.ref(h.tensor) for h in chosen]
        if self._cuda:
            self._copied[key] = self._offload_cuda(chosen)
        else:
            self._copied[key] = self._cpu_copy(0, chosen, "cpu", after=None)
        for h in chosen:
            h.where, h.moved = HOST, True
        self._offloaded[key] = chosen
        if self.record and not self._cuda:
            self._wait(self._copied[key])
            freed = sum(1 for ref in originals if ref() is None)
            self._log("offload", key, chosen, freed=freed)

    def reload(self, stage: int, microbatch: int) -> None:
        """Bring back what :meth:`offload` moved, before the backward needs it."""
        key = (stage, microbatch)
        chosen = self._offloaded.pop(key, [])
        copied = self._copied.pop(key, None)
        if self._cuda:
            self._reload_cuda(chosen, copied if isinstance(copied, torch.cuda.Event) else None)
        else:
            after = copied if isinstance(copied, Future) else None
            ready = self._cpu_copy(1, chosen, self.device, after=after)
            for h in chosen:
                h.ready = ready
        for h in chosen:
            h.where = DEVICE
        if self.record and not self._cuda:
            for h in chosen:
                self._wait(h.ready)
            self._log("reload", key, chosen)

    def _cpu_copy(
        self,
        direction: int,
        chosen: list[SavedActivation],
        to: str | torch.device,
        *,
        after: Future[None] | None,
    ) -> Future[None]:
        """Copy ``chosen`` to ``to`` on the CPU copy thread of ``direction`` (0 out, 1 back)."""
        pools = self._cpu_copies
        if pools is None:
            threads = torch.get_num_threads()  # the pool's threads would default to all cores
            pools = self._cpu_copies = (
                ThreadPoolExecutor(1, "pp_opt-d2h", torch.set_num_threads, (threads,)),
                ThreadPoolExecutor(1, "pp_opt-h2d", torch.set_num_threads, (threads,)),
            )

        def copy() -> None:
            if after is not None:
                after.result()
            for h in chosen:
                h.tensor = h.tensor.to(to, copy=True)

        job = pools[direction].submit(copy)
        self._pending.append(job)
        return job

    def _wait(self, ready: torch.cuda.Event | Future[None] | None) -> None:
        if isinstance(ready, Future):
            ready.result()
        elif ready is not None:
            ready.synchronize()

    def wait_copies(self) -> None:
        """Wait for every CPU copy issued so far (CUDA copies are ordered by their events)."""
        pending, self._pending = self._pending, []
        for job in pending:
            job.result()

    def _offload_cuda(self, chosen: list[SavedActivation]) -> torch.cuda.Event:
        stream = self._d2h
        if stream is None:
            raise RuntimeError("offload on CUDA without a copy stream; build it with a CUDA device")
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for h in chosen:
                host = torch.empty_like(h.tensor, device="cpu", pin_memory=True)
                host.copy_(h.tensor, non_blocking=True)
                h.tensor.record_stream(stream)  # its memory is reused only after the copy
                h.tensor = host
            done = torch.cuda.Event()
            done.record(stream)
        return done

    def _reload_cuda(self, chosen: list[SavedActivation], copied: torch.cuda.Event | None) -> None:
        stream = self._h2d
        if stream is None:
            raise RuntimeError("reload on CUDA without a copy stream; build it with a CUDA device")
        # Start only after the compute issued before this reload (and its frees) is done:
        # the schedule's cross-stream wait (pp_opt.simulator.order_of), so memory stays
        # within what the solver planned.
        stream.wait_stream(torch.cuda.current_stream(self.device))
        if copied is not None:
            stream.wait_event(copied)
        with torch.cuda.stream(stream):
            for h in chosen:
                h.tensor = h.tensor.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        for h in chosen:
            h.ready = ready

    def _unpack(self, stage: int, microbatch: int, handle: SavedActivation) -> torch.Tensor:
        key = (stage, microbatch)
        if handle.where == HOST:
            logger.warning(
                "stage %d microbatch %d: backward ran before its RELOAD; reloading now",
                stage,
                microbatch,
            )
            self.reload(stage, microbatch)
        if isinstance(handle.ready, Future):
            handle.ready.result()
            handle.ready = None
        elif handle.ready is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(handle.ready)
            handle.tensor.record_stream(compute)
            handle.ready = None
        if self.record and key not in self._unpacked:
            self._unpacked.add(key)
            live = [h for ref in self._saved.get(key, []) if (h := ref()) is not None]
            self._log("unpack", key, [h for h in live if h.moved])
        return handle.tensor

    def _log(
        self, action: str, key: tuple[int, int], handles: list[SavedActivation], freed: int = 0
    ) -> None:
        self.events.append(
            OffloadEvent(
                action=action,
                stage=key[0],
                microbatch=key[1],
                tensors=len(handles),
                nbytes=sum(_nbytes(h.tensor) for h in handles),
                locations=tuple(h.where for h in handles),
                freed=freed,
            )
        )


def storage_pointers(tensors: Iterable[object]) -> set[int]:
    """Storage pointers of tensors (to tell saved tensors that alias them)."""
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _first_bytes(handles: list[SavedActivation], fraction: float) -> list[SavedActivation]:
    """The first handles (in save order) that hold at least ``fraction`` of the bytes."""
    if fraction >= 1.0:
        return list(handles)
    target = fraction * sum(_nbytes(h.tensor) for h in handles)
    chosen, total = [], 0
    for h in handles:
        if total >= target:
            break
        chosen.append(h)
        total += _nbytes(h.tensor)
    return chosen
