"""Quick timing and memory of compute-only op orders, for generators that try many orders.

A rule generator searched over its parameters times dozens of candidate orders of
the same problem. :class:`CompiledProblem` reads the problem's DAG once (edges and
latencies from :func:`pp_opt.dag.build_dag`, durations and memory effects from
:mod:`pp_opt.ops`, so no rule is restated here) and then times an order in a few
milliseconds. It is only a filter: the order a generator returns is always timed
again by :func:`pp_opt.simulator.simulate` and checked by the validator.

On one compute stream memory changes only at op starts (allocations) and ends
(frees), and every op ends before the next one starts, so a device's peak is the
highest prefix sum of its order: a property of the order alone, not of its timing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pp_opt.dag import build_dag
from pp_opt.errors import DeadlockError
from pp_opt.ops import OpKey, OpKind, Stream, memory_delta
from pp_opt.problem import Problem

PerDevice = Sequence[Sequence[OpKey]]
"""One compute-stream op list per device."""


@dataclass(slots=True)
class CompiledProblem:
    """The problem's compute ops (no offload, no recompute) as flat lookup tables."""

    problem: Problem
    preds: dict[OpKey, list[tuple[OpKey, float]]]
    """DAG predecessors with the edge latency."""
    succs: dict[OpKey, list[tuple[OpKey, float]]]
    """DAG successors with the edge latency."""
    duration: dict[OpKey, float]
    alloc: dict[OpKey, float]
    """Memory the op allocates at its start."""
    free: dict[OpKey, float]
    """Memory the op frees at its end (a positive number)."""
    _indexed: tuple[Any, ...] | None = None

    @classmethod
    def of(cls, problem: Problem, *, split_backward: bool | None = None) -> CompiledProblem:
        dag = build_dag(problem, split_backward=split_backward, offload=False, recompute=False)
        preds: dict[OpKey, list[tuple[OpKey, float]]] = {key: [] for key in dag}
        succs: dict[OpKey, list[tuple[OpKey, float]]] = {key: [] for key in dag}
        for u, w, latency in dag.edges(data="latency"):
            preds[w].append((u, latency))
            succs[u].append((w, latency))
        alloc, free = {}, {}
        for key in dag:
            at_start, at_end = memory_delta(problem, key.kind, key.stage)
            alloc[key], free[key] = at_start, -at_end
        duration = {key: data["duration"] for key, data in dag.nodes(data=True)}
        return cls(problem, preds, succs, duration, alloc, free)

    def ends(self, per_device: PerDevice) -> dict[OpKey, float]:
        """Earliest end of every op when each device runs its list in order.

        Raises :class:`DeadlockError` when the lists wait on each other.
        """
        p = self.problem.p
        tables = self._tables()
        index, preds, duration, successor_devices = tables
        lists = [[index[key] for key in ops] for ops in per_device]
        position, free_at = [0] * p, [0.0] * p
        end = [-1.0] * len(duration)
        todo = list(range(p))
        while todo:
            device = todo.pop()
            ops = lists[device]
            while position[device] < len(ops):
                op = ops[position[device]]
                start = free_at[device]
                for u, latency in preds[op]:
                    done = end[u]
                    if done < 0:
                        break
                    if done + latency > start:
                        start = done + latency
                else:
                    end[op] = free_at[device] = start + duration[op]
                    position[device] += 1
                    todo.extend(successor_devices[op])
                    continue
                break
        if any(position[d] < len(lists[d]) for d in range(p)):
            stuck = [str(per_device[d][position[d]]) for d in range(p)
                     if position[d] < len(lists[d])]  # fmt: skip
            raise DeadlockError(f"order deadlocks at {', '.join(stuck[:4])}")
        return {key: end[i] for key, i in index.items() if end[i] >= 0}

    def _tables(self) -> tuple[dict[OpKey, int], list[Any], list[float], list[list[int]]]:
        """Integer-indexed copies of the lookup tables (built once, on first use)."""
        if self._indexed is None:
            keys = list(self.preds)
            index = {key: i for i, key in enumerate(keys)}
            preds = [[(index[u], lat) for u, lat in self.preds[k]] for k in keys]
            duration = [self.duration[k] for k in keys]
            devices = [sorted({self.problem.device_of(w.stage) for w, _ in self.succs[k]})
                       for k in keys]  # fmt: skip
            self._indexed = (index, preds, duration, devices)
        return self._indexed

    def makespan(self, per_device: PerDevice) -> float:
        """Last end minus first start (every order here starts at time 0)."""
        return max(self.ends(per_device).values())

    def peaks(self, per_device: PerDevice) -> list[float]:
        """Highest static + activation memory of each device under its order."""
        out = []
        for device, ops in enumerate(per_device):
            level = peak = self.problem.devices[device].static
            for key in ops:
                level += self.alloc[key]
                peak = max(peak, level)
                level -= self.free[key]
            out.append(peak)
        return out

    def fits(self, per_device: PerDevice, *, tol: float = 1e-9) -> bool:
        """Whether every device's peak is within its cap."""
        caps = [d.cap for d in self.problem.devices]
        return all(peak <= cap + tol * max(1.0, cap)
                   for peak, cap in zip(self.peaks(per_device), caps, strict=True))  # fmt: skip


def streams_of(per_device: PerDevice) -> dict[tuple[int, Stream], list[OpKey]]:
    """The per-``(device, stream)`` form of compute-only lists."""
    return {(d, Stream.COMPUTE): list(ops) for d, ops in enumerate(per_device)}


def compute_lists(problem: Problem, streams: Mapping[tuple[int, Stream], Sequence[OpKey]]
                  ) -> list[list[OpKey]]:  # fmt: skip
    """The compute-stream list of each device (empty where a device has none)."""
    return [list(streams.get((d, Stream.COMPUTE), ())) for d in range(problem.p)]


BACKWARD = (OpKind.B, OpKind.BW)
