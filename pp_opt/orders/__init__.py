"""Op orders: every generator of an :class:`~pp_opt.order.Order`, behind one registry.

- Fixed patterns (the classic baselines): :mod:`.classic` (GPipe, 1F1B, interleaved
  1F1B), :mod:`.zero_bubble` (ZB-H1, ZB-H2), :mod:`.vshape` (ZB-V, PyTorch's order).
- Rules that adapt to the costs and the caps: :mod:`.list_schedules` (list schedules,
  including one that fits any feasible cap), :mod:`.zb_greedy` and :mod:`.zb_v_greedy`
  (the Zero Bubble paper's cost-aware greedy, tuned by :mod:`.zb_tune`).
- PyTorch's schedules under PyTorch's names (``GPipe``, ``1F1B``, ``Interleaved1F1B``,
  ``LoopedBFS``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``):
  :mod:`.pytorch_schedules`, listed in :data:`PYTORCH_SCHEDULES`.
- A pass: :mod:`.offload_warm` puts offload copies in the gaps of a schedule.

Every generator has the signature ``(problem) -> Order``; :data:`REGISTRY`
(:mod:`.registry`) names them and says which are baselines and which are warm starts.
:func:`baseline` (:mod:`.baselines`) times and validates one by name;
:func:`candidates` (:mod:`.warm_starts`) lists the warm starts of a problem.
"""

from pp_opt.orders.baselines import (
    baseline,
    baseline_names,
    best_baseline,
    cap_shortfall,
    fits_cap,
)
from pp_opt.orders.common import OrderGenerator
from pp_opt.orders.pytorch_schedules import PYTORCH_SCHEDULES
from pp_opt.orders.registry import REGISTRY, Entry
from pp_opt.orders.warm_starts import Candidate, candidates

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
