"""The built wheel works on its own: installed outside the checkout, it finds its bundled cards
by name and solves a profiled problem from the command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _run(args: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=True, **kwargs
    )  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy, so the checkout gets no build/ folder; without build isolation,
    # so this environment's setuptools builds it, offline.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("pp_opt", "models"):  # models/: the card sources the wheel ships
        shutil.copytree(ROOT / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--quiet", "-w", out, source])  # fmt: skip
    (found,) = out.glob("pp_opt-*.whl")
    return found


def test_wheel_ships_cards_and_type_information(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "pp_opt/py.typed" in names
    cards = {f"pp_opt/card_files/{path.name}" for path in (ROOT / "models").glob("*.toml")}
    shipped = {"pp_opt/card_files/zb-1.5b.toml", "pp_opt/card_files/llama3.1-405b.toml"}
    assert shipped <= cards <= names
    assert "pp_opt/card_files/README.md" in names


def test_installed_wheel_solves_by_card_name(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    # Install first, while the new environment sees nothing else (pip must not touch the
    # checkout's editable install); then let it see this environment's dependencies
    # (plain paths in a .pth file: the editable install's own .pth is not processed).
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--quiet",
          wheel])  # fmt: skip
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    deps = sysconfig.get_path("purelib")
    (Path(site.stdout.strip()) / "test_deps.pth").write_text(deps + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = _run([python, "-c", "import pp_opt; print(pp_opt.__file__)"], cwd=work, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv)
    listed = _run([venv / "bin" / "pp-opt", "models"], cwd=work, env=env).stdout
    assert "zb-1.5b" in listed and "a100-80gb" in listed
    # 22 layers do not split evenly into 4 stages: the Zero Bubble split (ends one less).
    _run([venv / "bin" / "pp-opt", "solve", "--model", "zb-1.5b", "--hardware", "a100-80gb",
          "--pp", "4", "--layers", "5,6,6,5", "--microbatches", "8", "--time-limit", "2",
          "-q", "-o", "out.json"], cwd=work, env=env)  # fmt: skip
    assert (work / "out.json").is_file()
    _run([venv / "bin" / "pp-opt", "validate", "out.json"], cwd=work, env=env)
