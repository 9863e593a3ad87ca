"""Running ``pp-opt`` in-process for tests: exit code, stdout and stderr."""

from __future__ import annotations

import pytest

from pp_opt.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
