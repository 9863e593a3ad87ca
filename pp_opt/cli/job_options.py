"""The options of a job's fields, made from their declarations in :class:`pp_opt.job.Job`.

``predict`` and ``profile`` take one value of each field, ``plan`` a comma list of values to
try (or a switch), each as its :class:`~pp_opt.job.JobOption` says; a command names none of
them itself, so a new field reaches every command that should take it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

from pp_opt.errors import ProblemError
from pp_opt.job import DEFAULTS, FIELDS, TYPES, JobOption, check_ac, job_options

JOB_FIELDS = "job_fields"
"""The parameter a decorated command receives the given fields in (name -> value)."""


def parse_values(name: str, text: str, spec: JobOption) -> tuple[Any, ...]:
    """``2,4`` or ``none,full`` as the values of field ``name`` to try."""
    items = [x for x in text.replace(" ", "").split(",") if x] if name != "ac" else _modes(text)
    if not items:
        raise ProblemError(name, f"got {text!r}; give values separated by commas")
    try:
        return tuple(_one(name, item, spec) for item in items)
    except ProblemError as err:
        raise ProblemError(name, f"got {text!r}; {err.message.partition('; ')[2]}") from None


def _modes(text: str) -> list[str]:
    """``none,modules:layernorm,moe_act`` splits into ``none`` and the modules list."""
    out: list[str] = []
    for item in text.replace(" ", "").split(","):
        if out and out[-1].startswith("modules:") and ":" not in item and not _is_mode(item):
            out[-1] += "," + item
        elif item:
            out.append(item)
    return out


def _is_mode(item: str) -> bool:
    from pp_opt.job import ACTIVATION_CHECKPOINT_MODES

    return item in ACTIVATION_CHECKPOINT_MODES


def _one(name: str, item: str, spec: JobOption) -> Any:
    kind = TYPES[name]
    if kind.startswith(("int", "tuple")):
        try:
            value = int(item)
        except ValueError:
            raise ProblemError(name, f"got {item!r}; give integers separated by commas") from None
        if spec.low is not None and value < spec.low:
            raise ProblemError(name, f"got {value}; give integers of at least {spec.low:g}")
        return value
    if kind.startswith("float"):
        try:
            return float(item)
        except ValueError:
            raise ProblemError(name, f"got {item!r}; give a number") from None
    if name == "ac":
        return check_ac(item)
    if spec.choices and item not in spec.choices:
        raise ProblemError(name, f"got {item!r}; give {_alternatives(spec.choices)}")
    return item


def _alternatives(choices: tuple[str, ...]) -> str:
    """``loop, v or loop,v``: each choice, then all of them as a list."""
    named = [c for c in choices if c]
    return f"{', '.join(named)} or {','.join(named)}" if len(named) > 1 else named[0]


def _parameter(name: str, spec: JobOption, command: str) -> inspect.Parameter:
    """The typer parameter of one field under ``command``."""
    kind, flags = TYPES[name], [spec.flag(name), *([spec.short] if spec.short else [])]
    searched = command == "plan" and spec.plan == "values"
    annotation: Any
    if kind.startswith("bool") and (
        DEFAULTS[name] is True or spec.negatable or (spec.plan == "both" and command == "plan")
    ):
        flags = [f"{spec.flag(name)}/--no-{spec.flag(name)[2:]}"]
        annotation, default = bool | None, typer.Option(None, *flags, help=spec.help)
    elif kind.startswith("bool"):
        annotation, default = bool, typer.Option(False, *flags, help=spec.help)
    else:
        scalar = {"int": int, "float": float}.get(kind.split(" ")[0], str)
        annotation = str | None if searched or kind.startswith("tuple") else scalar | None
        hint = " Comma list of values to try." if searched else ""
        default = typer.Option(None, *flags, help=spec.help + hint)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=annotation)  # fmt: skip


def with_job_options(command: str, *, skip: tuple[str, ...] = ()) -> Callable[..., Any]:
    """Give a command one option per job field ``command`` takes (but ``skip``); the values
    given arrive parsed in its ``job_fields`` parameter (absent ones left out)."""
    specs = {k: v for k, v in job_options(command).items() if k not in skip}

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(func, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != JOB_FIELDS]
        added = [_parameter(name, spec, command) for name, spec in specs.items()]

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in specs if name in kwargs}
            fields = {
                k: _value(k, v, specs[k], command)
                for k, v in given.items()
                if v is not None and (v is not False or _pinned_off(k, command))
            }
            return func(*args, **kwargs, **{JOB_FIELDS: fields})

        params = sorted(kept + added, key=lambda p: p.kind)
        run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__  # typer reads the signature above, not the function's own
        return run

    return wrap


def _pinned_off(name: str, command: str) -> bool:
    """A False that says something: a ``--no-`` flag, not an absent switch."""
    spec = FIELDS[name]
    return DEFAULTS[name] is True or spec.negatable or (command == "plan" and spec.plan == "both")


def _value(name: str, value: Any, spec: JobOption, command: str) -> Any:
    """An option's value as the Job (or the plan's pins) takes it."""
    kind = TYPES[name]
    if isinstance(value, str) and command == "plan" and spec.plan == "values":
        return parse_values(name, value, spec)
    if isinstance(value, str) and kind.startswith("tuple"):
        return parse_values(name, value, spec)
    if name == "ac" and isinstance(value, str):
        return check_ac(value)
    return value
