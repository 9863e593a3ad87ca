"""How the package holds together: no import cycles, a light ``import pp_opt``, one DAG build
per problem variant in a solve, and solves that keep their time limit."""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import time
import tokenize
from pathlib import Path

import networkx as nx
import pytest

import pp_opt
import pp_opt.dag
from pp_opt import load_problem, solve, validate
from pp_opt.order import Variant
from pp_opt.problem import uniform_problem

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pp_opt"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph() -> nx.DiGraph:
    """Every import of a pp_opt module by another, wherever it sits (function bodies and
    ``TYPE_CHECKING`` blocks included)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def test_no_import_cycles() -> None:
    graph = _import_graph()
    assert graph.number_of_nodes() > 50
    cycles = list(nx.simple_cycles(graph))
    assert cycles == [], f"import cycles: {cycles[:5]}"


def test_import_pp_opt_is_light() -> None:
    heavy = ("ortools", "pulp", "highspy", "matplotlib", "torch")
    code = f"import sys, pp_opt; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_api_is_typed_and_importable() -> None:
    for name in pp_opt.__all__:
        assert getattr(pp_opt, name) is not None
    assert (PACKAGE / "py.typed").is_file()


def test_one_dag_build_per_variant_in_a_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tuple[object, Variant]] = []
    original = pp_opt.dag.build_dag

    def spy(problem, **switches):  # noqa: ANN001, ANN202 - same signature as build_dag
        dag = original(problem, **switches)
        built.append((problem, dag.graph["variant"]))
        return dag

    monkeypatch.setattr(pp_opt.dag, "build_dag", spy)
    pp_opt.dag._cached_dag.cache_clear()
    problem = uniform_problem(p=4, m=8, t_comm=0.1, m_w=0.5, name="count-dags")
    result = solve(problem, time_limit=10)
    variants = [variant for _, variant in built]
    assert len(variants) == len(set(variants))  # each variant once
    assert set(variants) == {
        Variant(split_backward=True, offload=False, recompute=False),  # the problem's own
        Variant(split_backward=False, offload=False, recompute=False),  # GPipe, 1F1B
    }
    assert all(p == problem for p, _ in built)
    assert validate(result.schedule) == []


@pytest.mark.timing
@pytest.mark.slow
def test_large_problem_keeps_a_short_time_limit() -> None:
    problem = load_problem(ROOT / "examples" / "zb-28.3b.toml")
    started = time.perf_counter()
    result = solve(problem, time_limit=1)
    assert time.perf_counter() - started < 3.0
    assert validate(result.schedule) == []


@pytest.mark.timing
def test_small_problem_keeps_its_time_limit() -> None:
    # The span of small.toml is not proved optimal in a second: the search runs to the limit.
    problem = load_problem(ROOT / "examples" / "small.toml")
    started = time.perf_counter()
    result = solve(problem, time_limit=1, objective="span")
    assert time.perf_counter() - started < 1 * 1.05 + 2
    assert validate(result.schedule) == []


def test_nothing_below_the_planner_imports_it() -> None:
    graph = _import_graph()
    above = ("pp_opt", "pp_opt.planner", "pp_opt.cli")
    for name in graph.nodes:
        if name in above or name.startswith(above[1:]):
            continue
        bad = [t for t in graph.successors(name) if t.startswith("pp_opt.planner")]
        assert bad == [], f"{name} imports the planner: {bad}"


PROFILER = PACKAGE / "profiler"
TORCH_WING = PROFILER / "torch"
"""The PyTorch wing of the profiler (model blocks, measurement); the rest states the cost
model and runs without torch."""


def _pure_profiler() -> list[Path]:
    return sorted(p for p in PROFILER.rglob("*.py") if TORCH_WING not in p.parents)


def _imported_names(node: ast.AST) -> list[str]:
    """The absolute module names an ``import`` node names (relative ones left out)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        base = node.module or ""
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    return []


def test_the_pure_profiler_does_not_import_torch() -> None:
    pure = _pure_profiler()
    assert {p.stem for p in pure} >= {"__init__", "analytic", "cards", "costs", "formulas"}
    wing = _module_name(TORCH_WING)
    for path in pure:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = _imported_names(node)
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path.name
        for node in tree.body:  # the wing only lazily, inside a function
            names = _imported_names(node)
            assert not any(n == wing or n.startswith(wing + ".") for n in names), path.name


def test_importing_the_pure_profiler_loads_no_torch() -> None:
    modules = [_module_name(p) for p in _pure_profiler()]
    code = f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; " + (
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _reads_profile_costs(node: ast.AST) -> bool:
    """``<x>.extra["profile"]["stages"]`` (or ``.get``): costs dug out of a problem."""
    if not isinstance(node, ast.Subscript):
        return False
    inner = node.value
    if not (isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Attribute)):
        return False
    key = inner.slice
    return (
        inner.value.attr == "extra"
        and isinstance(key, ast.Constant)
        and key.value == "profile"
        and isinstance(node.slice, ast.Constant)
        and node.slice.value in ("stages", "layout")
    )


def test_costs_are_not_read_back_from_problem_extra() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if _reads_profile_costs(node):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    for path in (PACKAGE / "planner").rglob("*.py"):  # the planner keeps its CostProfile
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "extra":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
"""House rules (STYLE.md), counted from ``def`` to the last line, docstring included; a
command-line function (in ``pp_opt/cli/``) is counted from the line after its signature,
so a command's option declarations do not count."""

CLI = PACKAGE / "cli"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _signature_end(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The line of the ``:`` that closes ``node``'s signature (after ``) -> ...``)."""
    source = io.StringIO("".join(lines[node.lineno - 1 : node.end_lineno]))
    depth = 0
    for token in tokenize.generate_tokens(source.readline):
        if token.type != tokenize.OP:
            continue
        if token.string in "([{":
            depth += 1
        elif token.string in ")]}":
            depth -= 1
        elif token.string == ":" and depth == 0:
            return node.lineno + token.start[0] - 1
    raise AssertionError(f"no end of signature for {node.name} at line {node.lineno}")


def _function_lengths(path: Path) -> dict[str, int]:
    """Each function's length by the rule of :data:`MAX_FUNCTION_LINES`."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    lengths: dict[str, int] = {}
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            last = node.end_lineno or node.lineno
            first = _signature_end(lines, node) + 1 if CLI in path.parents else node.lineno
            lengths[f"{_module_name(path)}.{node.name}"] = last - first + 1
    return lengths


def test_signature_end_skips_a_commands_options() -> None:
    source = "def f(\n    a: int = g(1,\n      2),\n) -> dict[str, int]:\n    return {}\n"
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    assert _signature_end(source.splitlines(keepends=True), node) == 4


def test_modules_stay_short() -> None:
    long = {
        _module_name(path): lines
        for path in _modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_functions_stay_short() -> None:
    long = {
        name: lines
        for path in _modules()
        for name, lines in _function_lengths(path).items()
        if lines > MAX_FUNCTION_LINES
    }
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
