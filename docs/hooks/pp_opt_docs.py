"""MkDocs hooks: the command reference page, generated from the ``pp-opt`` app itself, and
the Sphinx roles of API docstrings shown as code.

``docs/reference/cli.md`` holds the marker ``<!-- pp-opt commands -->``; this hook puts in
its place typer's own Markdown for the app (``typer.cli.get_docs_for_click``, what
``typer pp_opt.cli utils docs`` prints): one section per command, with its arguments and
options, so a new command or flag is documented by the next build. It runs in the build's
process, so a failure to import the app fails the build (mkdocs-typer2's legacy engine runs
a subprocess and leaves the page empty on failure; its native engine does not read the
options of typer >= 0.23, which bundles its own click).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- pp-opt commands -->"
PAGE = "reference/cli.md"


def on_config(config: Any) -> Any:
    """Document this checkout's pp_opt, not another copy installed in the environment."""
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def command_reference() -> str:
    """Every ``pp-opt`` command as a ``##`` section, the program's own help first."""
    import typer
    from typer.cli import get_docs_for_click

    from pp_opt.cli import app

    command = typer.main.get_command(app)
    ctx = typer.Context(command)
    docs = get_docs_for_click(obj=command, ctx=ctx, name="pp-opt")
    first, _, rest = docs.partition("\n")  # the page has its own title
    if not first.startswith("# "):
        raise RuntimeError(f"unexpected typer docs heading: {first!r}")
    return rest.strip() + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise RuntimeError(f"{PAGE} lost its marker {MARKER}")
    return markdown.replace(MARKER, command_reference())


ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc|obj):<code>(~?)([^<]*)</code>")
"""A Sphinx role left in a rendered docstring (the package's docstrings use them for
readers of the source): ``:func:`name``` renders as ``:func:<code>name</code>``."""


def _plain_role(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Sphinx roles in API docstrings shown as plain code (``~`` keeps the last name)."""
    return ROLE.sub(_plain_role, html)
