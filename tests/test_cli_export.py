"""``pp-opt export``: each format written from a schedule file, format inferred, one-line errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from cli_helpers import run
from order_helpers import timed

from pp_opt.errors import ProblemError
from pp_opt.export import FORMATS, default_output, format_for
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.problem import uniform_problem
from pp_opt.schedule import Schedule
from pp_opt.schedule_io import save_schedule

_TINY_1F1B = [
    [(OpKind.F, 0), (OpKind.F, 1), (OpKind.B, 0), (OpKind.W, 0), (OpKind.B, 1), (OpKind.W, 1)],
    [(OpKind.F, 0), (OpKind.B, 0), (OpKind.F, 1), (OpKind.B, 1), (OpKind.W, 0), (OpKind.W, 1)],
]


@pytest.fixture
def schedule_file(tmp_path: Path, loop_schedule: Schedule) -> Path:
    path = tmp_path / "run.json"
    save_schedule(loop_schedule, path)
    return path


def test_trace(schedule_file: Path, loop_schedule: Schedule, capsys) -> None:
    out = schedule_file.with_name("t.json")
    code, stdout, _ = run(
        ["export", str(schedule_file), "--format", "trace", "-o", str(out)], capsys
    )
    assert code == 0 and f"wrote {out} (trace)" in stdout
    events = json.loads(out.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(loop_schedule.ops)


@pytest.mark.parametrize(("suffix", "magic"), [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_pictures_from_suffix(tmp_path: Path, suffix: str, magic: bytes, capsys) -> None:
    pytest.importorskip("matplotlib")
    problem = uniform_problem(p=2, m=2, name="tiny")
    order = {
        (d, Stream.COMPUTE): [OpKey(kind, d, j) for kind, j in _TINY_1F1B[d]] for d in range(2)
    }
    schedule = timed(problem, order)
    # ZB-H1's closed form: m (t_f + t_b + t_w) + (p - 1)(t_f + t_b - t_w) = 6 + 1
    assert schedule.metrics.makespan == 7.0
    path = tmp_path / "tiny.json"
    save_schedule(schedule, path)
    out = tmp_path / ("picture" + suffix)
    code, stdout, _ = run(["export", str(path), "-o", str(out)], capsys)
    assert code == 0 and f"({suffix[1:]})" in stdout
    assert out.read_bytes().startswith(magic)


@pytest.mark.parametrize(("fmt", "csv_format"), [("torch-csv", "compute_only"),
                                                 ("torch-csv-comms", "compute_comms")])  # fmt: skip
def test_torch_csv(
    schedule_file: Path, loop_schedule: Schedule, fmt: str, csv_format: str, capsys
) -> None:
    torch_csv = pytest.importorskip("pp_opt.export.torch_csv")
    out = schedule_file.with_name("order.csv")
    code, _, err = run(["export", str(schedule_file), "-f", fmt, "-o", str(out)], capsys)
    assert code == 0, err
    with out.open(newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    assert rows == torch_csv.torch_csv_rows(loop_schedule, format=csv_format)
    assert len(rows) == loop_schedule.problem.p


def test_torch_csv_refuses_offload(
    tmp_path: Path, offload_schedule: Schedule, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pp_opt.export.torch_csv")
    path = tmp_path / "offload.json"
    save_schedule(offload_schedule, path)
    code, _, err = run(["export", str(path), "-o", str(tmp_path / "order.csv")], capsys)
    assert code != 0
    assert "offload" in err.lower() and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "order.csv").exists()


def test_torch_csv_drop_offload_writes_the_compute_order(
    tmp_path: Path, offload_schedule: Schedule, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "offload.json"
    save_schedule(offload_schedule, path)
    out = tmp_path / "order.csv"
    code, _, _ = run(["export", str(path), "-o", str(out), "--drop-offload"], capsys)
    assert code == 0
    cells = [cell for line in out.read_text().splitlines() for cell in line.split(",") if cell]
    computes = [op for op in offload_schedule.ops if op.kind.value in ("F", "B", "W", "BW")]
    assert len(cells) == len(computes)
    assert not any("OFFLOAD" in cell or "RELOAD" in cell for cell in cells)


def test_default_output_next_to_the_schedule(schedule_file: Path, capsys) -> None:
    code, _, _ = run(["export", str(schedule_file), "--format", "trace"], capsys)
    assert code == 0
    assert json.loads(schedule_file.with_name("run.trace.json").read_text())["traceEvents"]
    assert default_output(schedule_file, "torch-csv") == schedule_file.with_name("run.csv")


def test_format_inference() -> None:
    assert format_for(Path("a.CSV")) == "torch-csv"
    assert format_for(Path("a.json")) == "trace"
    assert format_for(Path("a.png"), "SVG") == "svg"  # an explicit format wins
    assert set(FORMATS) == {"torch-csv", "torch-csv-comms", "trace", "png", "svg"}
    with pytest.raises(ProblemError, match="format"):
        format_for(None, None)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--format", "pdf", "-o", "x.pdf"], "--format: unknown 'pdf'; use one of torch-csv"),
        (["-o", "x.txt"], "cannot tell the format from 'x.txt'"),
        (["--format", "trace", "-o", "{schedule}"], "is the schedule itself"),
    ],
)
def test_errors_are_one_line(
    schedule_file: Path, args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(schedule=schedule_file) for a in args]
    code, _, err = run(["export", str(schedule_file), *args], capsys)
    assert code == 1
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_missing_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["export", str(tmp_path / "nope.json"), "-o", "x.json"], capsys)
    assert code == 1 and "no such file" in err
    assert not Path("x.json").exists()
