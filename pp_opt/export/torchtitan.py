"""A pipeline configuration as torchtitan reads it: config fields, flags and a config file.

:func:`torchtitan_settings` gives the fields (``parallelism``, ``training`` and the
activation checkpointing mode) of a release (:mod:`pp_opt.frameworks.torchtitan`);
:func:`torchtitan_flags` writes them as torchtitan's command-line overrides and
:func:`torchtitan_config_file` as a config function (0.3.0 chooses a job's config with
``--module MODULE --config FUNCTION``; it has no TOML job files). A job without a
pipeline (``pp = 1``) gets no pipeline key.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.export.training_config import check_shape
from pp_opt.frameworks import torchtitan as facts
from pp_opt.frameworks.pytorch import check_schedule_fits, csv_schedule_name
from pp_opt.job import Job

CONFIG_FUNCTION = "pp_opt_plan"
"""The name of the function :func:`torchtitan_config_file` writes."""


def torchtitan_settings(
    job: Job,
    *,
    schedule_csv: str | None,
    schedule_name: str | None = None,
    n_layers: int | None = None,
    split_backward: bool = False,
    version: str = facts.DEFAULT_RELEASE,
) -> dict[str, Any]:
    """The torchtitan fields of ``job``, as ``{"version", "parallelism", "training",
    "activation_checkpoint"}``.

    ``schedule_csv`` is a pp_opt torch-csv (torchtitan runs it on
    ``_PipelineScheduleRuntime``; the schedule name then only places the stages), or None
    with ``schedule_name`` one of PyTorch's schedules. ``split_backward`` says the CSV has
    ``I``/``W`` actions; a named schedule's own backward is taken from its name.
    ``n_layers``: the model's decoder layers, checked against the split (None: its sum).
    The batch keys are the job's microbatches, ``mbs``, ``dp`` replicas and ``seq``; the
    activation checkpointing mode is torchtitan's that runs the job's own.
    """
    release = facts.release(version)
    counts = check_shape(job, n_layers=n_layers)
    mode = facts.job_mode(job.ac)
    ac_value, ac_splits = facts.activation_checkpoint(mode)
    parallelism: dict[str, Any] = data_parallel_keys(job)
    if job.tp > 1:
        parallelism["tensor_parallel_degree"] = job.tp
    parallelism.update(expert_keys(job))
    if job.pp > 1:
        name = _schedule_name(job, schedule_csv=schedule_csv, schedule_name=schedule_name)
        fit = check_schedule_fits(
            name, placement=job.placement, v=job.v, with_csv=schedule_csv is not None
        )
        split = split_backward if schedule_csv is not None else fit.split_backward
        if split and not ac_splits:
            raise ProblemError(
                "torchtitan_activation_checkpoint", f"{mode} activation checkpointing cannot "
                "run a split backward (torchtitan fails at the first W: 'Trying to backward an "
                "extra time'); use none or full, or export with --fused-backward"
            )  # fmt: skip
        parallelism["pipeline_parallel_degree"] = job.pp
        parallelism["pipeline_parallel_schedule"] = name
        if schedule_csv is not None:
            parallelism["pipeline_parallel_schedule_csv"] = str(schedule_csv)
        count = release.microbatch_is_count
        parallelism[release.microbatch_key] = job.microbatches if count else job.mbs
        parallelism["module_fqns_per_model_part"] = facts.module_fqns(release, counts)
    training = _batch_keys(release, job)
    if job.pp > 1 or job.ep > 1:  # torchtitan refuses CUDA graphs with either
        training[release.cuda_graphs_key] = True
    return {
        "version": release.version,
        "parallelism": parallelism,
        "training": training,
        "activation_checkpoint": mode,
        "activation_checkpoint_value": ac_value,
    }


def data_parallel_keys(job: Job) -> dict[str, Any]:
    """The data- and context-parallel degrees, written out: torchtitan 0.3.0 would otherwise
    give every rank that tp x pp leaves to FSDP (``data_parallel_shard_degree = -1``,
    replicate and context degrees 1), a layout other than the job's. Its data parallelism
    is FSDP over ``dp_shard x cp``, replicated ``dp_replicate`` times (``ParallelismConfig``,
    ``models/llama3/parallelize.py``); it has no sharded optimizer beside replicated weights."""
    if job.optimizer_sharding and job.dp_shard == 1 and job.dp > 1:
        raise ProblemError(
            "optimizer_sharding", "torchtitan 0.3.0 shards the optimizer state only with FSDP; "
            f"use dp_shard {job.dp} (FSDP) or leave the optimizer replicated",
        )  # fmt: skip
    keys: dict[str, Any] = {"data_parallel_shard_degree": job.dp_shard}
    if job.dp_replicate > 1:
        keys["data_parallel_replicate_degree"] = job.dp_replicate
    if job.cp > 1:
        keys["context_parallel_degree"] = job.cp
    return keys


def expert_keys(job: Job) -> dict[str, Any]:
    """torchtitan 0.3.0's expert parallelism (``config/configs.py``: ``expert_parallel_degree``,
    ranks borrowed from ``dp_shard x cp x tp``, no expert tensor parallelism)."""
    if job.etp > 1:
        raise ProblemError("etp", "torchtitan 0.3.0 has no expert tensor parallelism; use etp 1")
    if job.ep == 1:
        return {}
    from pp_opt.profiler.stacks import check_expert_layout  # the rule its stack card states

    check_expert_layout(replace(job, stack="torchtitan"))
    return {"expert_parallel_degree": job.ep}


def _schedule_name(job: Job, *, schedule_csv: str | None, schedule_name: str | None) -> str:
    """The schedule name torchtitan is given: ``schedule_name``, or the one that places a
    CSV's stages."""
    if schedule_csv is not None and not str(schedule_csv).strip():
        raise ProblemError("schedule_csv", "empty path; give the CSV file or None")
    if schedule_name is not None:
        return schedule_name
    if schedule_csv is None:
        raise ProblemError("schedule_name", "give a PyTorch schedule name or a schedule_csv")
    return csv_schedule_name(placement=job.placement, v=job.v)


def _batch_keys(release: facts.TorchtitanRelease, job: Job) -> dict[str, Any]:
    """Local batch (pipeline: all microbatches; else one), global batch, sequence."""
    if release.batch_in_tokens:
        return {
            release.local_batch_key: job.mbs * job.seq,
            release.global_batch_key: job.global_batch * job.seq,
            release.seq_key: job.seq,
        }
    return {
        release.local_batch_key: job.microbatches * job.mbs if job.pp > 1 else job.mbs,
        release.global_batch_key: job.global_batch,
        release.seq_key: job.seq,
    }


def torchtitan_config(
    job: Job,
    *,
    schedule_csv: str | None,
    schedule_name: str | None = None,
    n_layers: int | None = None,
    version: str = facts.DEFAULT_RELEASE,
) -> dict[str, Any]:
    """The ``parallelism`` fields of a torchtitan job for this pipeline (release
    ``version``); :func:`pp_opt.export.torchtitan.torchtitan_settings` gives the
    ``training`` fields and the activation checkpointing mode too.

    ``schedule_csv`` is a pp_opt torch-csv (the name then only places the stages:
    ``PipelineScheduleSingle``/``PipelineScheduleMulti`` on ``loop``, ``ZBVZeroBubble`` on
    ``v`` when None), or None with ``schedule_name`` one of PyTorch's schedules.
    """
    settings = torchtitan_settings(
        job, schedule_csv=schedule_csv, schedule_name=schedule_name, n_layers=n_layers,
        version=version,
    )  # fmt: skip
    parallelism: dict[str, Any] = settings["parallelism"]
    return parallelism


def torchtitan_flags(settings: dict[str, Any]) -> list[str]:
    """torchtitan's command-line overrides of ``settings``; the activation checkpointing
    subcommand comes last (what follows it on the command line belongs to it)."""
    flags: list[str] = []
    for section in ("parallelism", "training"):
        for key, value in settings[section].items():
            flag = f"--{section}.{key}"
            if value is True:
                flags.append(flag)
            elif key == "module_fqns_per_model_part":
                flags += [flag, *(",".join(part) for part in value)]
            else:
                flags += [flag, str(value)]
    flags.append(f"activation-checkpoint:{settings['activation_checkpoint']}")
    return flags


def split_base(base: str) -> tuple[str, str]:
    """``module.path:function`` -> (module, function), checked."""
    module, sep, function = base.partition(":")
    names = module.split(".")
    if not sep or not function.isidentifier() or not all(n.isidentifier() for n in names):
        raise ProblemError(
            "torchtitan_base", f"got {base!r}; give MODULE:FUNCTION, e.g. {facts.DEBUG_CONFIG}"
        )
    return module, function


def base_config(model_name: str, base: str | None) -> str:
    """The torchtitan config function a job starts from: ``base``, or the card's own."""
    if base is not None:
        split_base(base)
        return base
    if model_name not in facts.BASE_CONFIGS:
        raise ProblemError(
            "torchtitan_base", f"torchtitan has no config of its own for model {model_name!r}; "
            f"give the config function to start from as MODULE:FUNCTION (e.g. "
            f"{facts.DEBUG_CONFIG})"
        )  # fmt: skip
    return facts.BASE_CONFIGS[model_name]


def run_command(
    settings: dict[str, Any], *, base: str, nproc: int, config_file: Path | None
) -> str:
    """The command that starts the job: the config file's function, or the base and flags."""
    head = f"torchrun --nproc-per-node {nproc} -m torchtitan.train"
    if config_file is not None:
        folder = shlex.quote(str(config_file.parent) or ".")
        return (f"PYTHONPATH={folder} {head} --module {config_file.stem} "
                f"--config {CONFIG_FUNCTION}")  # fmt: skip
    module, function = split_base(base)
    return shlex.join([*head.split(), "--module", module, "--config", function,
                       *torchtitan_flags(settings)])  # fmt: skip


def torchtitan_config_file(settings: dict[str, Any], *, base: str, title: str) -> str:
    """A config function file setting ``settings`` on ``base``'s config (a renamed or removed
    field fails when torchtitan loads it: the config dataclasses are slotted)."""
    module, function = split_base(base)
    value = settings["activation_checkpoint_value"]
    lines = [
        f'"""torchtitan {settings["version"]} job config written by pp-opt: {title}.',
        "",
        "Run from the folder torchtitan's paths are relative to, with this file's folder on",
        f"PYTHONPATH: torchrun ... -m torchtitan.train --module MODULE --config {CONFIG_FUNCTION}",
        '(MODULE: this file\'s name without ".py")."""',
        "",
    ]
    if value != "None":
        lines.append(facts.AC_IMPORT)
    lines += [f"from {module} import {function} as _base", "", "",
              f"def {CONFIG_FUNCTION}():", "    config = _base()"]  # fmt: skip
    for section in ("parallelism", "training"):
        for key, item in settings[section].items():
            lines.append(f"    config.{section}.{key} = {item!r}")
    lines += [f"    config.activation_checkpoint = {value}", "    return config", ""]
    return "\n".join(lines)


def write_config_file(path: str | Path, text: str) -> Path:
    """Write a config file whose name torchtitan's ``--module`` can import."""
    from pp_opt.atomic import write_text

    return write_text(check_config_path(path), text)


def check_config_path(path: str | Path) -> Path:
    """A config file path whose name torchtitan's ``--module`` can import."""
    path = Path(path)
    if path.suffix != ".py" or not path.stem.isidentifier():
        raise ProblemError(
            "torchtitan_config", f"got {path.name!r}; name it MODULE.py with MODULE a Python "
            "identifier (torchtitan imports it with --module MODULE)"
        )  # fmt: skip
    return path
