"""torchtitan's config keys, module names and required settings, keyed by release.

``0.3`` was checked against the torchtitan 0.3.0 wheel (2026-09-03): ``config/configs.py``
(``TrainingConfig``, ``ParallelismConfig``), ``distributed/pipeline_parallel.py``
(``_generate_llm_fqn_per_model_part``, ``_build_pipeline_schedule``),
``models/common/decoder.py`` (``tok_embeddings``, ``layers``, ``norm``, ``lm_head``),
``models/llama3/config_registry.py`` and ``distributed/activation_checkpoint.py``.
``next`` is torchtitan's main branch at b5bcd76c (2026-08-21), which renamed the batch
keys to token counts and the microbatch key to ``num_pp_microbatches`` (2026-08-20).

0.3.0 has no TOML job files: a job is a Python function returning ``Trainer.Config``,
chosen with ``--module MODULE --config FUNCTION`` and overridden with ``--SECTION.KEY``
flags; the activation checkpointing policy is a subcommand
(``activation-checkpoint:none``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.arguments import integer
from pp_opt.errors import ProblemError
from pp_opt.frameworks.pytorch import schedule_name


@dataclass(kw_only=True, slots=True, frozen=True)
class TorchtitanRelease:
    """What one torchtitan release reads."""

    version: str
    """The release line (``0.3``) or ``next``."""
    checked: str
    """The source the facts were checked against."""
    embedding: str
    """Module name of the token embedding (on the first stage)."""
    layer_prefix: str
    """Decoder layers are ``{layer_prefix}.{i}``."""
    final_modules: tuple[str, ...]
    """Modules after the last layer (on the last stage), in order."""
    microbatch_key: str
    """``parallelism`` key of the microbatches: a size (0.3) or a count (next)."""
    microbatch_is_count: bool
    """``microbatch_key`` takes the number of microbatches, not their size."""
    batch_in_tokens: bool
    """Batch keys are token counts (next) rather than sequences (0.3)."""
    local_batch_key: str
    """``training`` key of one data-parallel rank's batch per step (pipeline: all its
    microbatches; no pipeline: one microbatch)."""
    global_batch_key: str
    """``training`` key of the global batch."""
    seq_key: str
    """``training`` key of the sequence length."""
    cuda_graphs_key: str = "disable_cuda_graphs"
    """``training`` key that must be True for every pipeline job (0.3.0 refuses PP with
    CUDA graphs)."""


RELEASES: dict[str, TorchtitanRelease] = {
    "0.3": TorchtitanRelease(
        version="0.3", checked="torchtitan 0.3.0 wheel (2026-09-03)",
        embedding="tok_embeddings", layer_prefix="layers", final_modules=("norm", "lm_head"),
        microbatch_key="pipeline_parallel_microbatch_size", microbatch_is_count=False,
        batch_in_tokens=False, local_batch_key="local_batch_size",
        global_batch_key="global_batch_size", seq_key="seq_len",
    ),
    "next": TorchtitanRelease(
        version="next", checked="torchtitan main at b5bcd76c (2026-08-21)",
        embedding="tok_embeddings", layer_prefix="layers", final_modules=("norm", "lm_head"),
        microbatch_key="num_pp_microbatches", microbatch_is_count=True,
        batch_in_tokens=True, local_batch_key="num_tokens_per_microbatch_per_dp_rank",
        global_batch_key="num_tokens_per_train_step", seq_key="max_context_length",
    ),
}  # fmt: skip
"""Every release pp_opt writes for."""

DEFAULT_RELEASE = "0.3"
"""The current release (0.3.0, 2026-09)."""

BASE_CONFIGS = {
    "llama3-8b": "torchtitan.models.llama3.config_registry:llama3_8b",
    "llama3-70b": "torchtitan.models.llama3.config_registry:llama3_70b",
    "llama3.1-405b": "torchtitan.models.llama3.config_registry:llama3_405b",
}
"""torchtitan's own config function of each bundled model card that has one
(``models/llama3/config_registry.py``: 32, 80 and 126 layers, as the cards)."""


@dataclass(frozen=True, slots=True)
class ModelDefaults:
    """What torchtitan 0.3.0's config function of a model sets that a plan's baseline takes."""

    ac: str
    """pp_opt's checkpointing mode of its ``activation_checkpoint`` (``FullAC``: ``full``;
    ``SelectiveAC``, per-op in 0.3.0: ``selective_op``)."""
    local_batch: int
    """``training.local_batch_size``: the microbatch of a job without a pipeline."""


MODEL_DEFAULTS = {
    "llama3-8b": ModelDefaults(ac="selective_op", local_batch=1),
    "llama3-70b": ModelDefaults(ac="full", local_batch=8),
    "llama3.1-405b": ModelDefaults(ac="full", local_batch=2),
}
"""The settings of :data:`BASE_CONFIGS`' functions (``models/llama3/config_registry.py`` of
the 0.3.0 wheel: ``llama3_8b`` SelectiveAC, local batch 1; ``llama3_70b`` FullAC, 8;
``llama3_405b`` FullAC, 2)."""

TRAINER_DEFAULTS = ModelDefaults(ac="selective_op", local_batch=8)
"""``Trainer.Config``'s own (``trainer.py``: ``SelectiveAC.Config``; ``config/configs.py``:
``local_batch_size = 8``), for a model without a config function."""

PIPELINE_MICROBATCH_SIZE = 1
"""``parallelism.pipeline_parallel_microbatch_size`` when not given (``config/configs.py``)."""


def model_defaults(model: str) -> ModelDefaults:
    """torchtitan's checkpointing and local batch for model card ``model``."""
    return MODEL_DEFAULTS.get(model, TRAINER_DEFAULTS)


def default_microbatch_size(model: str, pp: int, sequences: int) -> int:
    """The sequences per microbatch torchtitan runs when not told: with a pipeline
    :data:`PIPELINE_MICROBATCH_SIZE`; without, the model's local batch (at most the
    ``sequences`` of one data-parallel rank per step, and dividing them)."""
    integer("sequences", sequences, low=1)
    if pp > 1:
        return PIPELINE_MICROBATCH_SIZE
    local = min(model_defaults(model).local_batch, sequences)
    return max(d for d in range(1, local + 1) if sequences % d == 0)


DEFAULT_SCHEDULE = "1F1B"
"""``parallelism.pipeline_parallel_schedule`` when not given (``config/configs.py:216`` at
b5bcd76c): one stage per rank."""

INTERLEAVED_SCHEDULE = "Interleaved1F1B"
"""The schedule a user names to run more than one stage per rank (the default runs one)."""

MULTI_STAGE_STAGES_PER_RANK = 2
"""Stages per rank of a multi-stage schedule when ``pipeline_parallel_layers_per_stage`` is
not given (``distributed/pipeline_parallel.py:260-262`` at b5bcd76c); one for a
single-stage schedule."""


def default_stages_per_rank(schedule: str) -> int:
    """The stages per rank (pp_opt's ``v``) torchtitan builds for PyTorch's ``schedule``."""
    single = schedule_name(schedule).stages_per_rank == "one"
    return 1 if single else MULTI_STAGE_STAGES_PER_RANK


def default_schedule(v: int) -> str:
    """The schedule a torchtitan user runs ``v`` stages per rank with: the default for one,
    :data:`INTERLEAVED_SCHEDULE` for more."""
    return DEFAULT_SCHEDULE if v == 1 else INTERLEAVED_SCHEDULE


DEBUG_CONFIG = "torchtitan.models.llama3.config_registry:llama3_debugmodel"
"""torchtitan's 6-layer llama3 debug model (what the end-to-end test trains)."""

ACTIVATION_CHECKPOINT = {
    "none": ("None", True),
    "full": ("FullAC.Config()", True),
    "selective": ("SelectiveAC.Config()", False),
}
"""Activation checkpointing mode -> (its value in a config function, whether a split
backward runs with it). Selective checkpointing fails at the first ``W`` action ("Trying
to backward an extra time"); full or none run ``I`` and ``W`` (measured with 0.3.0)."""

AC_IMPORT = "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC"
"""Where the activation checkpointing configs live (0.3.0 and next)."""


def release(version: str) -> TorchtitanRelease:
    """The release of ``version`` (``0.3``, ``0.3.0``, ``0.3.x`` or ``next``)."""
    text = str(version).strip().lower()
    key = "next" if text == "next" else ".".join(text.split(".")[:2])
    if key not in RELEASES:
        raise ProblemError(
            "torchtitan", f"no facts for torchtitan {version!r}; use one of "
            + ", ".join(RELEASES) + " (0.3 is torchtitan 0.3.x)"
        )  # fmt: skip
    return RELEASES[key]


JOB_MODES = {"none": "none", "selective": "selective", "selective_op": "selective", "full": "full"}
"""pp_opt's activation checkpointing mode of a job (:data:`pp_opt.job.ACTIVATION_CHECKPOINT_MODES`)
-> torchtitan's mode that runs it."""


def job_mode(ac: str) -> str:
    """torchtitan's checkpointing mode that runs a job's ``ac`` (Megatron-Core's module list
    has none)."""
    if ac not in JOB_MODES:
        raise ProblemError(
            "ac", f"torchtitan has no {ac!r} checkpointing; use none, selective_op or full"
        )
    return JOB_MODES[ac]


def activation_checkpoint(mode: str) -> tuple[str, bool]:
    """``mode``'s config value and whether a split backward runs with it."""
    if mode not in ACTIVATION_CHECKPOINT:
        raise ProblemError(
            "torchtitan_activation_checkpoint",
            f"got {mode!r}; use one of {', '.join(ACTIVATION_CHECKPOINT)}",
        )
    return ACTIVATION_CHECKPOINT[mode]


def module_fqns(facts: TorchtitanRelease, layers: list[int]) -> list[list[str]]:
    """``module_fqns_per_model_part``: each stage's module names, in stage order."""
    parts: list[list[str]] = []
    first = 0
    for count in layers:
        parts.append([f"{facts.layer_prefix}.{i}" for i in range(first, first + count)])
        first += count
    parts[0].insert(0, facts.embedding)
    parts[-1] += list(facts.final_modules)
    return parts


def default_layers(
    n_layers: int, stages: int, *, input_weight: int = 1, output_weight: int = 1
) -> tuple[int, ...]:
    """The split torchtitan makes when not given one (``_generate_llm_fqn_per_model_part``,
    ``distributed/pipeline_parallel.py:357`` at b5bcd76c).

    The embedding counts as ``input_weight`` layers on the first stage and the norm and
    output layer as ``output_weight`` on the last (torchtitan's
    ``pipeline_parallel_first/last_stage_less_layers``, 1 each by default); the
    ``n_layers + input_weight + output_weight`` units are spread evenly, the remainder to
    the first stages. 32 layers on 4 stages: ``(8, 9, 8, 7)``.
    """
    integer("n_layers", n_layers, low=1)
    integer("stages", stages, low=1)
    if stages == 1:
        return (n_layers,)
    units = n_layers + input_weight + output_weight
    per, extra = divmod(units, stages)
    if per < max(1, input_weight, output_weight):
        raise ProblemError(
            "stages", f"{stages} stages for {n_layers} layers leave a stage empty in "
            "torchtitan's split; use fewer stages"
        )  # fmt: skip
    counts = [per + (1 if s < extra else 0) for s in range(stages)]
    counts[0] -= input_weight
    counts[-1] -= output_weight
    return tuple(counts)
