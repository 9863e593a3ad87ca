"""The documentation's examples run: every page of ``docs/`` has at least one fenced block
marked runnable (an HTML comment ``<!-- runnable -->`` on the line before its fence), and
each such block runs as it is, in a fresh folder that has ``examples/`` in it.

Python blocks run in this process (solves too: ``PP_OPT_IN_PROCESS=1``), bash blocks in
``bash -euo pipefail`` with this environment's ``pp-opt`` first on ``PATH``. Keep them small:
a few seconds each. Every name of ``pp_opt.__all__`` has an API reference entry.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pp_opt

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKER = "<!-- runnable -->"
EXCLUDED = ("benchmarks/tables/",)
"""Fragments the pages include (generated benchmark tables), not pages."""
BLOCK = re.compile(re.escape(MARKER) + r"\n```(\w+)\n(.*?)\n```", re.DOTALL)


def _pages() -> list[Path]:
    pages = sorted(DOCS.rglob("*.md"))
    return [p for p in pages if not str(p.relative_to(DOCS)).startswith(EXCLUDED)]


def _blocks() -> list[tuple[str, int, str, str]]:
    """``(page, index, language, code)`` of every runnable block."""
    found = []
    for page in _pages():
        for i, match in enumerate(BLOCK.finditer(page.read_text())):
            found.append((str(page.relative_to(DOCS)), i, match.group(1), match.group(2)))
    return found


BLOCKS = _blocks()


def test_every_page_has_a_runnable_example() -> None:
    with_examples = {page for page, *_ in BLOCKS}
    missing = [str(p.relative_to(DOCS)) for p in _pages()]
    missing = [page for page in missing if page not in with_examples]
    assert missing == [], f"pages without a runnable example: {missing}"


def test_every_public_name_has_an_api_entry() -> None:
    text = "\n".join(p.read_text() for p in (DOCS / "reference" / "api").glob("*.md"))
    documented = set(re.findall(r"^::: pp_opt\.(\w+)$", text, re.MULTILINE))
    assert sorted(set(pp_opt.__all__) - documented) == []


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PP_OPT_IN_PROCESS", "1")
    return tmp_path


@pytest.mark.parametrize(
    ("page", "index", "language", "code"),
    BLOCKS,
    ids=[f"{page}#{index}" for page, index, *_ in BLOCKS],
)
def test_runnable_example(workdir: Path, page: str, index: int, language: str, code: str) -> None:
    if language == "python":
        exec(compile(code, f"docs/{page}#{index}", "exec"), {"__name__": "__docs__"})
        return
    assert language in ("bash", "console"), f"{page}: no runner for {language}"
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, f"docs/{page}#{index} failed:\n{done.stdout}\n{done.stderr}"
