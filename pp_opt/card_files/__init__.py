"""The bundled model and hardware cards: TOML files shipped with the package, found by name.

The card sources live in the checkout's top-level ``models/`` folder; the wheel ships
them here, as ``pp_opt/card_files/*.toml`` (``setup.py`` copies them at build time), and a
checkout (or an editable install) reads ``models/`` itself. Adding a card is adding one
``<name>.toml`` file to ``models/``. A card is a hardware card when it has
``peak_tflops``, else a model card; its description is the first sentence of its
leading comment. What the keys mean is in ``models/README.md``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[2] / "models"
"""The card sources of a checkout (read when the package holds no cards: not built)."""


@dataclass(frozen=True, slots=True)
class CardInfo:
    """One bundled card, as ``pp-opt models`` lists it."""

    name: str
    kind: str
    """``model``, ``hardware`` or ``stack`` (``stack-<name>.toml``)."""
    description: str


def _folder() -> Traversable:
    """The package's own cards when it was built with them (a wheel), else ``models/``."""
    shipped = resources.files(__name__)
    if any(entry.name.endswith(".toml") for entry in shipped.iterdir()):
        return shipped
    return SOURCES


def card_names() -> list[str]:
    """Names of every bundled card, sorted."""
    return sorted(
        entry.name.removesuffix(".toml")
        for entry in _folder().iterdir()
        if entry.name.endswith(".toml")
    )


def card_text(name: str) -> str | None:
    """The TOML text of the bundled card ``name``, or None when there is none."""
    if name not in card_names():
        return None
    return (_folder() / f"{name}.toml").read_text(encoding="utf-8")


def card_infos() -> list[CardInfo]:
    """Every bundled card with its kind and a one-line description, by kind then name."""
    infos = []
    for name in card_names():
        text = card_text(name) or ""
        kind = "hardware" if "peak_tflops" in tomllib.loads(text) else "model"
        kind = "stack" if name.startswith("stack-") else kind
        infos.append(CardInfo(name=name, kind=kind, description=describe(text)))
    return sorted(infos, key=lambda c: (c.kind != "model", c.name))


def describe(text: str) -> str:
    """The first sentence of a card's leading comment, without parentheses."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    words = " ".join(lines)
    while True:  # drop (possibly nested) parenthesised asides
        shorter = re.sub(r"\s*\([^()]*\)", "", words)
        if shorter == words:
            break
        words = shorter
    sentence = re.split(r"(?<=[^\s.])[.:](?:\s|$)", words, maxsplit=1)[0]
    return " ".join(sentence.split())
