"""The documentation's examples run: every page of ``docs/`` has at least one fenced block
marked runnable (an HTML comment ``<!-- runnable -->`` on the line before its fence), and
each such block runs as it is, in a fresh folder that has ``examples/`` and ``scripts/``
in it.

Python blocks run in this process (solves too: ``PP_OPT_IN_PROCESS=1``), bash blocks in
``bash -euo pipefail`` with this environment's ``pp-opt`` first on ``PATH``. Keep them small:
a few seconds each. Every name of ``pp_opt.__all__`` has an API reference entry.
"""

from __future__ import annotations

import json
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
    for folder in ("examples", "scripts"):
        (tmp_path / folder).symlink_to(ROOT / folder)
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


def _schema_validator(name: str):  # noqa: ANN202
    """A validator of ``docs/schemas/NAME.schema.json`` that resolves the other schemas."""
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    schemas = {p.name: json.loads(p.read_text()) for p in (DOCS / "schemas").glob("*.json")}
    registry = referencing.Registry().with_resources(
        (key, referencing.Resource.from_contents(value)) for key, value in schemas.items()
    )
    schema = schemas[f"{name}.schema.json"]
    return jsonschema.Draft202012Validator(schema, registry=registry)


def test_schemas_describe_the_files_pp_opt_writes(workdir: Path) -> None:
    from pp_opt.schedule_io import schedule_to_dict

    problem = pp_opt.load_problem("examples/small.toml")
    schedule = pp_opt.baseline("zb-h1", problem.replace(offload=True))
    pp_opt.save_schedule(schedule, "s.json")
    costs = pp_opt.profile_job(pp_opt.Job(pp=2, microbatches=4, seq=1024), model="llama2-7b",
                               hardware="a100-80gb").to_dict()  # fmt: skip
    fits = pp_opt.predict(model="llama3-8b", hardware="h100-80gb", gpus=8, global_batch=32,
                          seq=8192, pp=4, dp_shard=2, schedule="1F1B", ac="full")  # fmt: skip
    over = pp_opt.predict(model="llama3-8b", hardware="h100-80gb", gpus=8, global_batch=32,
                          seq=8192, pp=4, dp_shard=2, schedule="1F1B")  # fmt: skip
    pins = pp_opt.Pins(tp=(1,), pp=(2,), v=(1,), placement=("loop",), mbs=(1,), recompute=False,
                       offload=False)  # fmt: skip
    plan = pp_opt.plan(model="llama2-7b", hardware="a100-80gb", gpus=2, global_batch=4, seq=1024,
                       pins=pins, time_limit=4, splits=1, refine_top=0)  # fmt: skip
    files = {
        "plan": plan.to_dict(),
        "schedule": json.loads(Path("s.json").read_text()),
        "problem": schedule_to_dict(schedule)["problem"],
        "costs": costs,
        "prediction": fits.to_dict(),
    }
    for name, data in [*files.items(), ("prediction", over.to_dict())]:
        errors = [e.message for e in _schema_validator(name).iter_errors(data)]
        assert errors == [], f"{name}: {errors[:3]}"


def _readme_predictions() -> list[tuple[str, list[tuple[str, str]]]]:
    """``(command, [(figure, value)])`` of the README's ``pp-opt predict`` examples: the
    figures the comment under each command says it prints."""
    lines = (ROOT / "README.md").read_text().replace("\\\n", " ").splitlines()
    found = []
    for line, comment in zip(lines, lines[1:], strict=False):
        if line.startswith("pp-opt predict") and comment.startswith("# "):
            figures = re.findall(r"(step time|TPS/GPU|MFU|peak memory) ([\d.]+)", comment)
            found.append((line, figures))
    return found


def test_readme_predictions_print_what_the_readme_says(workdir: Path) -> None:
    examples = _readme_predictions()
    assert len(examples) >= 2 and all(figures for _, figures in examples)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for command, figures in examples:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, f"{command}:\n{done.stderr}"
        printed = {
            label: line.split()[len(label.split())].rstrip("%")
            for line in done.stdout.splitlines()
            for label, _ in figures
            if line.startswith(label)
        }
        for label, value in figures:
            assert printed.get(label) == value, (
                f"README says {label} {value}; {command!r} prints {printed.get(label)}"
            )
