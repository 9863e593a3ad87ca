"""Op orders: every generator of an :class:`~pp_opt.order.Order`, behind one registry.

The generators sit in one sub-package per family:

- :mod:`.patterns`: fixed patterns (the classic baselines): :mod:`.patterns.classic`
  (GPipe, 1F1B, interleaved 1F1B), :mod:`.patterns.zero_bubble` (ZB-H1, ZB-H2),
  :mod:`.patterns.vshape` (ZB-V, PyTorch's order), and PyTorch's schedules under
  PyTorch's names (``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``LoopedBFS``,
  ``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``):
  :mod:`.patterns.pytorch_schedules`, listed in :data:`PYTORCH_SCHEDULES`.
- :mod:`.greedy`: the Zero Bubble paper's cost-aware greedy rules
  (:mod:`.greedy.zb_greedy`, :mod:`.greedy.zb_v_greedy`, tuned by :mod:`.greedy.zb_tune`).
- :mod:`.memory`: rules built around the memory caps: list schedules, one of which fits
  any feasible cap (:mod:`.memory.list_schedules`), V-Half and V-Min
  (:mod:`.memory.controllable_memory`), PipeOffload (:mod:`.memory.pipeoffload`).
- :mod:`.offload`: passes that add offload copies to a compute order
  (:mod:`.offload.offload_links`, :mod:`.offload.offload_warm`).
- :mod:`.search`: what searching generators share (quick timing :mod:`.search.fast_eval`,
  local search :mod:`.search.order_search`, budgets :mod:`.search.pieces`) and the warm
  starts of a solve (:mod:`.search.warm_starts`).

Every generator has the signature ``(problem) -> Order``; :data:`REGISTRY`
(:mod:`.registry`) names them and says which are baselines and which are warm starts.
:func:`baseline` (:mod:`.named`) times and validates one by name;
:func:`candidates` (:mod:`.search.warm_starts`) lists the warm starts of a problem.
"""

from pp_opt.orders.common import OrderGenerator
from pp_opt.orders.named import (
    baseline,
    baseline_names,
    best_baseline,
    cap_shortfall,
    fits_cap,
)
from pp_opt.orders.patterns.pytorch_schedules import PYTORCH_SCHEDULES
from pp_opt.orders.registry import REGISTRY, Entry
from pp_opt.orders.search.warm_starts import Candidate, candidates

__all__ = [
    "PYTORCH_SCHEDULES",
    "REGISTRY",
    "Candidate",
    "Entry",
    "OrderGenerator",
    "baseline",
    "baseline_names",
    "best_baseline",
    "candidates",
    "cap_shortfall",
    "fits_cap",
]
