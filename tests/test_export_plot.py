"""Pictures: Gantt boxes match the ops, memory lines match the metrics, files get written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="pictures need the plot extra (matplotlib)")

from dataclasses import replace  # noqa: E402

from matplotlib.figure import Figure  # noqa: E402

from pp_opt.errors import PPOptError, ProblemError  # noqa: E402
from pp_opt.export import plot_memory, plot_schedule, save_figure  # noqa: E402
from pp_opt.export.plot import KIND_COLORS  # noqa: E402
from pp_opt.ops import OpKind, Stream  # noqa: E402
from pp_opt.problem import uniform_problem  # noqa: E402
from pp_opt.schedule import Schedule  # noqa: E402
from pp_opt.simulator import order_of, simulate  # noqa: E402

SCHEDULES = ["loop_schedule", "v_schedule", "offload_schedule"]


def _boxes(ax) -> list[tuple[float, float, float, tuple[float, ...]]]:
    """``(start, duration, row centre, rgb)`` of every Gantt box."""
    boxes = []
    for collection in ax.collections:
        for path, colour in zip(collection.get_paths(), collection.get_facecolors(), strict=True):
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            centre = round((ys.min() + ys.max()) / 2, 9)
            boxes.append(
                (round(xs.min(), 9), round(xs.max() - xs.min(), 9), centre, tuple(colour[:3]))
            )
    return boxes


@pytest.mark.parametrize("which", SCHEDULES)
def test_one_box_per_op(which: str, request: pytest.FixtureRequest) -> None:
    schedule: Schedule = request.getfixturevalue(which)
    ax = plot_schedule(schedule)
    boxes = sorted(box[:2] for box in _boxes(ax))
    ops = sorted((round(op.start, 9), round(op.duration, 9)) for op in schedule.ops)
    assert boxes == ops
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {op.kind.value for op in schedule.ops} <= legend
    assert ax.get_xlim() == (0.0, schedule.metrics.makespan)


def test_rows_and_labels(offload_schedule: Schedule) -> None:
    ax = plot_schedule(offload_schedule)
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == [n for d in range(4) for n in (f"device {d}", "d2h", "h2d")]
    # every (device, stream) row sits at its own height; copies below their compute row
    centres = sorted({box[2] for box in _boxes(ax)})
    assert len(centres) == 3 * 4
    assert [t for t in ax.get_yticks()] == pytest.approx(centres)
    labels = [t.get_text() for t in ax.texts]
    assert labels and all(text.isdigit() and int(text) < 6 for text in labels)


def test_colours_by_kind_and_chunk(v_schedule: Schedule) -> None:
    from matplotlib.colors import to_rgb

    ax = plot_schedule(v_schedule, labels=False)
    forward = to_rgb(KIND_COLORS[OpKind.F])
    starts = {
        round(op.start, 9): op
        for op in v_schedule.stream_order(0, Stream.COMPUTE)
        if op.kind is OpKind.F
    }
    colours = {}
    for start, _, centre, rgb in _boxes(ax):
        op = starts.get(start)
        if op is not None and centre == 0.5:  # device 0's compute row
            colours[op.stage] = rgb
    assert colours[0] == pytest.approx(forward)  # first chunk: the kind's colour
    assert colours[7] != pytest.approx(forward)  # second chunk: lighter
    assert all(c >= f for c, f in zip(colours[7], forward, strict=True))
    assert not ax.texts


@pytest.mark.parametrize("which", SCHEDULES)
def test_memory_lines_reach_the_peak(which: str, request: pytest.FixtureRequest) -> None:
    schedule: Schedule = request.getfixturevalue(which)
    ax = plot_memory(schedule)
    lines = {line.get_label(): line for line in ax.get_lines()}
    for d, peak in enumerate(schedule.metrics.peak_memory):
        assert max(lines[f"device {d}"].get_ydata()) == pytest.approx(peak)
        assert lines[f"device {d}"].get_xdata()[-1] == pytest.approx(schedule.metrics.makespan)
    assert lines["cap"].get_linestyle() == "--"
    assert list(lines["cap"].get_ydata()) == [schedule.problem.devices[0].cap] * 2


def test_draws_on_given_axes(loop_schedule: Schedule) -> None:
    fig = Figure()
    gantt, memory = fig.subplots(2)
    assert plot_schedule(loop_schedule, gantt, legend=False, title=False) is gantt
    assert plot_memory(loop_schedule, memory, devices=[1], legend=False) is memory
    assert [line.get_label() for line in memory.get_lines()] == ["device 1", "cap"]
    with pytest.raises(ProblemError, match="devices"):
        plot_memory(loop_schedule, memory, devices=[4])


@pytest.mark.parametrize("which", SCHEDULES)
def test_save_png_and_svg(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    schedule: Schedule = request.getfixturevalue(which)
    png, svg = tmp_path / "s.png", tmp_path / "s.svg"
    save_figure(schedule, png, dpi=50)
    save_figure(schedule, svg)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5_000
    text = svg.read_text()
    assert "<svg" in text and schedule.problem.name in text


def test_save_figure_needs_a_known_suffix(loop_schedule: Schedule, tmp_path: Path) -> None:
    with pytest.raises(ProblemError, match=r"\.png, \.svg or \.pdf"):
        save_figure(loop_schedule, tmp_path / "s.gif")


def test_missing_matplotlib_says_how_to_install(
    loop_schedule: Schedule, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PPOptError, match=r"pip install 'pp-opt\[plot\]'"):
        plot_schedule(loop_schedule)


def test_profiled_units(loop_schedule: Schedule) -> None:
    """Bytes show as GiB, and a profile's time unit labels the time axis."""
    gib = 2.0**30
    problem = uniform_problem(p=4, m=8, t_w=0.5, m_b=3 * gib, m_w=gib, t_comm=0.1, unit="bytes")
    problem = problem.replace(extra={"profile": {"time_unit": "ms"}})
    schedule = simulate(replace(order_of(loop_schedule), problem=problem))
    ax = plot_memory(schedule)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert max(lines["device 0"].get_ydata()) == pytest.approx(
        schedule.metrics.peak_memory[0] / gib
    )
    assert lines["cap"].get_ydata()[0] == pytest.approx(2 * 4 * 3.0)  # default cap 2p m_b
    assert ax.get_ylabel() == "memory (GiB)" and ax.get_xlabel() == "time (ms)"
    assert plot_memory(loop_schedule).get_xlabel() == "time"
