"""Offload and recompute: allowed by the problem, OFFLOAD/RELOAD in pairs, in the F -> B window."""

from __future__ import annotations

from pp_opt.ops import OpKey, OpKind
from pp_opt.validator.context import Context
from pp_opt.validator.violation import Violation


def check_offload(ctx: Context) -> list[Violation]:
    """Switches, pairing, offload-and-recompute and the offload window, in that order."""
    return (
        _check_switches(ctx)
        + _check_pairs(ctx)
        + _check_offload_and_recompute(ctx)
        + _check_window(ctx)
    )


def _violation(ctx: Context, rule: str, key: OpKey, message: str, amount: float) -> Violation:
    return Violation(
        rule=rule, message=message, op=key, device=ctx.problem.device_of(key.stage), amount=amount
    )


def _check_switches(ctx: Context) -> list[Violation]:
    """Offload ops only when ``problem.offload``, R only when ``problem.recompute``, B and W
    only when ``problem.split_backward`` (a fused ``BW`` is allowed either way)."""
    found = []
    for key, op in ctx.first.items():
        stage = ctx.problem.stages[key.stage]
        if key.kind in (OpKind.OFFLOAD, OpKind.RELOAD) and not ctx.problem.offload:
            moved = op.fraction * stage.m_b
            message = "the problem does not allow offload; set offload = true or drop the op"
            found.append(_violation(ctx, "offload_disabled", key, message, moved))
        if key.kind is OpKind.R and not ctx.problem.recompute:
            message = "the problem does not allow recompute; set recompute = true or drop the op"
            found.append(
                _violation(ctx, "recompute_disabled", key, message, stage.m_b - stage.m_in)
            )
    split = [key for key in ctx.first if key.kind in (OpKind.B, OpKind.W)]
    if split and not ctx.problem.split_backward:
        message = ("the problem's backward is fused (split_backward = false); set "
                   "split_backward = true or run fused BW ops")  # fmt: skip
        found.append(_violation(ctx, "split_disabled", min(split), message, float(len(split))))
    return found


def _check_pairs(ctx: Context) -> list[Violation]:
    """Each OFFLOAD has the RELOAD of the same activation, with the same fraction."""
    found = []
    for key, op in ctx.first.items():
        m_b = ctx.problem.stages[key.stage].m_b
        if key.kind is OpKind.OFFLOAD:
            partner = ctx.first.get(OpKey(OpKind.RELOAD, key.stage, key.microbatch))
            if partner is None:
                message = "has no RELOAD; the activation never comes back for its backward"
                found.append(_violation(ctx, "offload_pairing", key, message, op.fraction * m_b))
            elif abs(partner.fraction - op.fraction) > ctx.tol:
                message = (
                    f"offloads fraction {op.fraction:.6g} but its RELOAD brings back "
                    f"{partner.fraction:.6g}; use the same fraction"
                )
                amount = abs(partner.fraction - op.fraction) * m_b
                found.append(_violation(ctx, "offload_pairing", partner.key, message, amount))
        elif (
            key.kind is OpKind.RELOAD
            and OpKey(OpKind.OFFLOAD, key.stage, key.microbatch) not in ctx.first
        ):
            message = "has no OFFLOAD; nothing was moved to the host to bring back"
            found.append(_violation(ctx, "offload_pairing", key, message, op.fraction * m_b))
    return found


def _check_offload_and_recompute(ctx: Context) -> list[Violation]:
    found = []
    for key, op in ctx.first.items():
        if key.kind is not OpKind.OFFLOAD:
            continue
        if (key.stage, key.microbatch) in ctx.recomputed:
            m_b = ctx.problem.stages[key.stage].m_b
            message = "this activation is also recomputed (R); choose offload or recompute"
            found.append(_violation(ctx, "offload_and_recompute", key, message, op.fraction * m_b))
    return found


def _check_window(ctx: Context) -> list[Violation]:
    """OFFLOAD from F's end to the backward's start (never between B and W)."""
    back_kind = OpKind.B if ctx.dag.graph["split_backward"] else OpKind.BW
    found = []
    for key, op in ctx.first.items():
        if key.kind is not OpKind.OFFLOAD:
            continue
        forward = ctx.first.get(OpKey(OpKind.F, key.stage, key.microbatch))
        backward = ctx.first.get(OpKey(back_kind, key.stage, key.microbatch))
        if forward is not None and forward.end - op.start > ctx.time_tol:
            message = (
                f"starts at {op.start:.6g}, before its F ends at {forward.end:.6g}; "
                "an activation can be offloaded only once its forward is done"
            )
            found.append(_violation(ctx, "offload_window", key, message, forward.end - op.start))
        if backward is not None and op.end - backward.start > ctx.time_tol:
            message = (
                f"ends at {op.end:.6g}, after its {back_kind.value} starts at "
                f"{backward.start:.6g}; offload only in the F -> {back_kind.value} window"
            )
            found.append(_violation(ctx, "offload_window", key, message, op.end - backward.start))
    return found
