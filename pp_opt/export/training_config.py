"""A configuration as a training job takes it: torchtitan's config keys, Megatron-LM's flags.

Both take the pipeline shape pp_opt plans (DESIGN.md section 8): ``pp`` devices, ``v``
chunks per device on the ``loop`` or ``v`` placement, and ``layers``, the decoder layers
of each stage in stage order (``len(layers) == pp * v``), with the embedding on stage 0
and the final norm and output layer on the last stage.

- torchtitan: :mod:`pp_opt.export.torchtitan` (``torchtitan_config``: the ``parallelism``
  fields, the split given exactly as ``module_fqns_per_model_part``; the whole job as
  flags or a config file), on the pipeline shape checked here (:func:`check_shape`).
- :func:`megatron_flags`: the command-line flags of Megatron-LM's ``pretrain_gpt.py``; an
  even split is ``--num-layers-per-virtual-pipeline-stage`` (with ``v > 1``), a split
  that differs only on the first and last stage is
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, and
  any other is ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` decoder
  layer, ``L`` loss, stages split by ``|``).

The splits each makes when not given one are framework facts
(:func:`pp_opt.frameworks.torchtitan.default_layers`,
:func:`pp_opt.frameworks.megatron.default_layers`). Bad input raises
:class:`~pp_opt.errors.ProblemError` naming the argument.
"""

from __future__ import annotations

from collections.abc import Sequence

from pp_opt.errors import ProblemError

_RECOMPUTE_FLAGS = ("--recompute-granularity", "full", "--recompute-method", "uniform",
                    "--recompute-num-layers", "1")  # fmt: skip


# ---------------------------------------------------------------- checks


def positive_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProblemError(field, f"got {value!r}; give an integer >= 1")
    return value


def check_shape(
    *, pp: int, v: int, placement: str, layers: Sequence[int], n_layers: int
) -> list[int]:
    """The checked split: ``pp * v`` non-negative counts summing to ``n_layers``."""
    positive_int("pp", pp)
    positive_int("v", v)
    positive_int("n_layers", n_layers)
    if placement not in ("loop", "v"):
        raise ProblemError("placement", f"got {placement!r}; use 'loop' or 'v'")
    if placement == "v" and v != 2:
        raise ProblemError("v", f"got {v}; the 'v' placement has exactly 2 chunks per device")
    counts = list(layers)
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ProblemError(
                "layers", f"entry {count!r} is not a layer count; give integers >= 0"
            )
    if len(counts) != pp * v:
        raise ProblemError(
            "layers", f"got {len(counts)} stages; give one count per stage, pp * v = {pp * v}"
        )
    if sum(counts) != n_layers:
        raise ProblemError(
            "layers", f"the counts sum to {sum(counts)}; they must sum to n_layers = {n_layers}"
        )
    return counts


# ---------------------------------------------------------------- Megatron-LM


def pipeline_layout(layers: Sequence[int]) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` string of a split (stage order)."""
    stages = []
    for s, count in enumerate(layers):
        text = "t" if count == 1 else f"t*{count}" if count else ""
        if s == 0:
            text = "E" + text
        if s == len(layers) - 1:
            text += "L"
        stages.append(text)
    return "|".join(stages)


def _split_flags(counts: list[int], *, pp: int, v: int) -> list[str]:
    """The flags that give Megatron-LM this split, the simplest set that says it exactly."""
    if len(set(counts)) == 1:
        return [] if v == 1 else ["--num-layers-per-virtual-pipeline-stage", str(counts[0])]
    if v == 1 and pp >= 2:
        middle = counts[1:-1]
        if len(set(middle)) <= 1 and (not middle or middle[0] > 0):
            rest = middle[0] if middle else counts[-1]
            flags = []
            if counts[0] != rest:
                flags += ["--decoder-first-pipeline-num-layers", str(counts[0])]
            if counts[-1] != rest and middle:
                flags += ["--decoder-last-pipeline-num-layers", str(counts[-1])]
            return flags
    return ["--pipeline-model-parallel-layout", pipeline_layout(counts)]


def megatron_flags(
    *,
    tp: int,
    pp: int,
    v: int,
    placement: str,
    mbs: int,
    layers: Sequence[int],
    n_layers: int,
    global_batch: int,
    recompute: bool,
) -> list[str]:
    """Megatron-LM command-line flags for this configuration (``pretrain_gpt.py``).

    Parameters
    ----------
    tp, pp, v
        Tensor-parallel size, pipeline devices, chunks per device (virtual stages).
    placement
        ``loop`` only: Megatron-LM places virtual stages round-robin (stage ``s`` on
        rank ``s mod pp``); the ``v`` placement raises :class:`ProblemError`.
    mbs, global_batch
        ``--micro-batch-size`` and ``--global-batch-size`` (sequences).
    layers, n_layers
        Decoder layers per stage in stage order, and the model's total (``--num-layers``).
    recompute
        Full activation recompute of every layer (``--recompute-granularity full
        --recompute-method uniform --recompute-num-layers 1``): Megatron-LM recomputes
        every microbatch, where pp_opt's schedule may recompute only some.

    Returns
    -------
    list[str]
        Flags and values, in the order Megatron-LM's help lists them by group.
    """
    counts = check_shape(pp=pp, v=v, placement=placement, layers=layers, n_layers=n_layers)
    positive_int("tp", tp)
    positive_int("mbs", mbs)
    positive_int("global_batch", global_batch)
    if placement != "loop":
        raise ProblemError(
            "placement",
            "Megatron-LM places virtual stages in a loop (stage s on rank s mod pp), not "
            "in a V; use placement 'loop', or torchtitan for the V schedules",
        )
    if v > 1 and pp < 2:
        raise ProblemError("v", f"got v = {v} with pp = 1; Megatron-LM interleaves virtual "
                           "stages only over pp >= 2 ranks: use v = 1")  # fmt: skip
    if global_batch % mbs:
        raise ProblemError(
            "global_batch", f"{global_batch} is not a multiple of mbs = {mbs}; Megatron-LM "
            "needs whole microbatches"
        )  # fmt: skip
    flags = [
        "--tensor-model-parallel-size", str(tp),
        "--pipeline-model-parallel-size", str(pp),
        "--num-layers", str(n_layers),
        *_split_flags(counts, pp=pp, v=v),
        "--micro-batch-size", str(mbs),
        "--global-batch-size", str(global_batch),
    ]  # fmt: skip
    if recompute:
        flags += _RECOMPUTE_FLAGS
    return flags
