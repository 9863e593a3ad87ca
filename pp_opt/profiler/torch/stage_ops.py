"""The compute actions of one pipeline stage, run exactly as PyTorch's pipeline runtime runs them.

``torch.distributed.pipelining`` (2.13) executes, per stage and microbatch:

- ``F``: ``submod(*inputs)``; on the last stage also ``loss_fn(output, target)``
  (``_PipelineScheduleRuntime`` computes the loss inside the forward action).
- ``I`` (our ``B``): ``_backward.stage_backward_input(outputs or (loss,), output_grads,
  inputs, submod.parameters())``, which runs autograd to the stage inputs only, keeps the
  graph (``retain_graph=True``) and records the gradients that reach the weight-side
  subgraphs. On the first stage (its inputs need no gradient) it does nothing at all.
- ``W``: ``_backward.stage_backward_weight(submod.parameters(), param_groups)``, a second
  autograd pass from those subgraphs to the weights. On the first stage it is
  ``_backward.stage_backward`` instead: the whole backward.
- ``B`` (our fused ``BW``): ``_backward.stage_backward(outputs or loss, output_grads, inputs)``.

(``PipelineStage.backward_one_chunk`` and ``backward_weight_one_chunk``.) So PyTorch's split
is not the Zero Bubble split: ``I + W`` does more work than ``B``, and on the first stage
``W`` carries everything. Timing these calls, not a re-implementation, is what makes the
measured costs the costs of the schedule that runs.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.distributed.pipelining import _backward

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class StageRunner:
    """Runs F, I, W and B of one stage on fresh microbatch inputs, as the runtime does.

    ``make_input`` returns the stage input of one microbatch: token ids on the first stage,
    else an activation that requires grad (as the runtime's receive buffers do). What the
    runtime receives rather than computes (the input before F, the output gradient before
    I or B) is made by :meth:`receive_input` and :meth:`receive_grad`, outside the ops, so
    timing an op times only the op; the ops call them when the caller has not.
    """

    module: torch.nn.Module
    make_input: Callable[[], torch.Tensor]
    first: bool
    last: bool
    loss_fn: LossFn | None = None
    target: torch.Tensor | None = None
    _state: dict[str, Any] = field(default_factory=dict)
    _input: torch.Tensor | None = None

    def twin(self) -> StageRunner:
        """A runner of the same stage module for another microbatch in flight."""
        return replace(self, _state={}, _input=None)

    def receive_input(self) -> None:
        """The next forward's input, as a receive (or the batch, on the first stage) gives it."""
        self._input = self.make_input()

    def receive_grad(self) -> None:
        """The output gradient the next stage would send (none on the last stage: the loss)."""
        st = self._state
        if not self.last and st.get("grads") is None:
            st["grads"] = [torch.randn_like(st["outputs"][0])]

    def forward(self) -> None:
        """``F``: the stage forward (and the loss on the last stage); keeps what B needs."""
        if self._input is None:
            self.receive_input()
        inputs, self._input = [self._input], None
        output = self.module(*inputs)
        loss = None
        if self.last:
            if self.loss_fn is None or self.target is None:
                raise ValueError("the last stage needs loss_fn and target")
            loss = self.loss_fn(output, self.target)
        self._state = {"inputs": inputs, "outputs": (output,), "loss": loss, "grads": None}

    def _stage_output(self) -> Any:
        return (self._state["loss"],) if self.last else self._state["outputs"]

    def backward_input(self) -> None:
        """``I``: ``stage_backward_input`` (nothing on the first stage, as in PyTorch)."""
        self.receive_grad()
        st = self._state
        if self.first:
            st["param_groups"] = None
            return
        _, st["param_groups"] = _backward.stage_backward_input(
            list(self._stage_output()), st["grads"], st["inputs"], self.module.parameters()
        )

    def backward_weight(self) -> None:
        """``W``: ``stage_backward_weight``, or the full backward on the first stage."""
        st = self._state
        if self.first:
            _backward.stage_backward(st["outputs"], st["grads"], st["inputs"])
        else:
            _backward.stage_backward_weight(self.module.parameters(), st["param_groups"])
        self._state = {}

    def backward_full(self) -> None:
        """``B`` (fused): ``stage_backward`` of the loss or of the outputs."""
        self.receive_grad()
        st = self._state
        output = st["loss"] if self.last else st["outputs"]
        _backward.stage_backward(output, st["grads"], st["inputs"])
        self._state = {}


def saved_bytes(runner: StageRunner) -> dict[str, float]:
    """Bytes a forward keeps until its backward (``m_b``) and what is still held after I (``m_w``).

    ``m_b``: distinct storages autograd saves in F (parameters excluded), plus the stage output
    that the runtime keeps for the backward. ``m_w``: of those, the ones still alive after
    ``I`` (PyTorch keeps the graph for ``W``), plus the gradients ``I`` stored for ``W``.
    """
    params = {p.untyped_storage().data_ptr() for p in runner.module.parameters()}
    saved: dict[int, tuple[int, weakref.ref[torch.Tensor]]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = (storage.nbytes(), weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        runner.forward()
    out = runner._state["outputs"][0]
    m_b = sum(n for n, _ in saved.values())
    if out.untyped_storage().data_ptr() not in saved:
        m_b += out.untyped_storage().nbytes()
    runner.backward_input()
    alive = sum(n for n, ref in saved.values() if ref() is not None)
    groups = runner._state.get("param_groups") or []
    held = sum(g.untyped_storage().nbytes() for group in groups
               for grads in group.get("grads") or () for g in grads if g is not None)  # fmt: skip
    runner.backward_weight()
    for p in runner.module.parameters():
        p.grad = None
    return {"m_b": float(m_b), "m_w": float(min(alive + held, m_b)), "m_w_raw": float(alive + held)}


def copy_times(runner: StageRunner, device: torch.device, repeats: int = 3) -> dict[str, float]:
    """Time the runtime's own OFFLOAD and RELOAD of one forward's saved activations (ms).

    Uses :class:`pp_opt.runtime.offload.ActivationOffloader` with the ``keep`` set the runtime
    passes (parameters, stage inputs and outputs stay), so the times are those of the copies
    that run: pinned host memory on a side stream on CUDA, a host copy on CPU.
    """
    from pp_opt.runtime.offload import ActivationOffloader, storage_pointers

    offloader = ActivationOffloader(device, record=True)
    times: dict[str, list[float]] = {"offload": [], "reload": []}
    moved = 0
    for _ in range(repeats + 1):
        offloader.reset()
        with offloader.capture(0, 0):
            runner.forward()
        st = runner._state
        keep = storage_pointers(runner.module.parameters())
        keep |= storage_pointers(st["outputs"]) | storage_pointers(st["inputs"])
        times["offload"].append(timed(device, lambda: offloader.offload(0, 0, keep=keep)))  # noqa: B023
        times["reload"].append(timed(device, lambda: offloader.reload(0, 0)))
        moved = offloader.events[-1].nbytes
        offloader.events.clear()
        runner.backward_full()
    for p in runner.module.parameters():
        p.grad = None
    return {"t_offload": statistics.median(times["offload"][1:]),
            "t_reload": statistics.median(times["reload"][1:]), "bytes": float(moved)}  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], object]) -> float:
    """Milliseconds ``fn`` takes, the device synchronised before and after (CUDA)."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return 1e3 * (time.perf_counter() - start)
