"""Output files written whole or not at all, and checked for writability before long work.

Every file pp_opt writes (schedule and cost JSON, CSV, traces, pictures) goes through
:func:`atomic_write`: the content goes to a temporary file in the target's own folder,
is flushed to disk, and replaces the target in one ``os.replace``. A full disk, a
failing write or an interrupted run therefore leaves an existing file as it was (and no
temporary file behind). :func:`check_writable` fails early, before a solve or a profile
spends minutes on a result that could not be saved.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from pp_opt.errors import OutputError


def check_writable(path: str | Path, *, field: str = "output") -> Path:
    """``path`` as a Path once it can be written; :class:`OutputError` naming ``field`` if not.

    Checks that its folder exists and accepts new files (the temporary file of
    :func:`atomic_write`), and that the path is not a folder nor a read-only file.
    """
    if not isinstance(path, str | Path) or str(path) == "":
        raise OutputError(field, f"got {path!r}; give a file path")
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise OutputError(field, f"{target} is a folder; give a file name")
    if not folder.is_dir():
        raise OutputError(field, f"{target}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(field, f"{target}: folder {folder} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputError(field, f"{target} is read-only; choose another file")
    return target


@contextlib.contextmanager
def atomic_write(
    path: str | Path, *, binary: bool = False, field: str = "output", newline: str | None = None
) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path``; on success it replaces ``path`` atomically.

    On any error (including an interruption) the temporary file is removed, ``path`` is
    untouched, and an ``OSError`` becomes an :class:`OutputError` naming ``field``.
    """
    target = check_writable(path, field=field)
    fd, tmp = _temporary(target, field)
    mode = "wb" if binary else "w"
    encoding = None if binary else "utf-8"
    with (
        _replacing(target, tmp, field),
        os.fdopen(fd, mode, encoding=encoding, newline=newline) as f,
    ):
        yield f
        f.flush()
        os.fsync(f.fileno())


def write_text(path: str | Path, text: str, *, field: str = "output") -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_write(path, field=field) as f:
        f.write(text)
    return Path(path)


def write_with(path: str | Path, writer: Callable[[str], None], *, field: str = "output") -> Path:
    """Let ``writer`` write a file by name (e.g. matplotlib's ``savefig``), atomically.

    ``writer`` gets the name of a temporary file in the target's folder.
    """
    target = check_writable(path, field=field)
    fd, tmp = _temporary(target, field)
    os.close(fd)
    with _replacing(target, tmp, field):
        writer(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    return target


def _temporary(target: Path, field: str) -> tuple[int, str]:
    """A new temporary file in ``target``'s folder (so that ``os.replace`` is atomic)."""
    folder = target.parent if str(target.parent) else Path(".")
    try:
        return tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as err:
        raise OutputError(field, f"cannot write {target} ({err.strerror})") from None


@contextlib.contextmanager
def _replacing(target: Path, tmp: str, field: str) -> Iterator[None]:
    """Once the block has written ``tmp``, it replaces ``target``; on any error ``tmp`` is
    removed and ``target`` left as it was (an ``OSError`` becomes an :class:`OutputError`)."""
    try:
        yield
        _keep_mode(target, tmp)
        os.replace(tmp, target)
    except OSError as err:
        _remove(tmp)
        raise OutputError(
            field, f"cannot write {target} ({err.strerror}); any previous file is unchanged"
        ) from None
    except BaseException:
        _remove(tmp)
        raise


def _keep_mode(target: Path, tmp: str) -> None:
    """Give the new file the old one's permissions (or the umask's, as ``open`` would)."""
    try:
        mode = target.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)


def _remove(tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)
