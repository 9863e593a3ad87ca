"""Older spellings that still work, each with a one-line deprecation notice.

Chunks per device are ``v`` everywhere (API, TOML, JSON, CLI ``--v``); ``vpp`` and
``chunks`` were used before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, TypeVar

log = logging.getLogger("pp_opt")

T = TypeVar("T")

V_ALIASES = ("vpp", "chunks")
"""Former names of ``v`` (chunks per device)."""


def renamed(old: str, value: T | None, new: str, current: T) -> T:
    """``current``, unless a value came under the former name ``old`` (with a notice)."""
    if value is None:
        return current
    log.warning("%s is deprecated; use %s", old, new)
    return value


def with_v(data: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """``data`` with a ``vpp`` or ``chunks`` key renamed to ``v`` (with a notice)."""
    out = dict(data)
    for old in V_ALIASES:
        if old in out:
            log.warning("%s%s is deprecated; use %sv", where, old, where)
            value = out.pop(old)
            out.setdefault("v", value)
    return out
