"""Files written whole or not at all, and paths checked before any work.

A JSON report or case is written to a temporary file beside its path and
renamed over it (:func:`atomic_write_json`), so a reader, or a crash, never
sees half a file. A path given on the command line is checked before the
run starts: one to read must be a regular file (:func:`regular_file_problem`;
a FIFO's open would wait forever), one to write must be writable the way it
will be written (:func:`output_file_problem`). Imports nothing of c128a.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def readable_json(data: Any, indent: str = "") -> str:
    """JSON with one object key per line and every list of numbers or text
    on one line; a list of objects (a serving-loop case's steps) has one
    object after another (short diffs)."""
    inner = indent + "  "
    if isinstance(data, dict) and data:
        items = [f"{inner}{json.dumps(k)}: {readable_json(v, inner)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        items = [f"{inner}{readable_json(v, inner)}" for v in data]
        return "[\n" + ",\n".join(items) + f"\n{indent}]"
    return json.dumps(data)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def written_temporary(path: Path, text: str) -> Path:
    """``text`` in a temporary file beside ``path``, with the mode a new file
    gets (0666 under the umask, not mkstemp's 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o666 & ~_umask())
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Path(temporary)


def replace_with(path: Path, text: str) -> None:
    """Replace ``path`` with a file holding ``text``, whole or not at all."""
    temporary = written_temporary(path, text)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` as readable JSON so that a reader (or a crash) never
    sees half a file."""
    replace_with(Path(path), readable_json(data) + "\n")


FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def regular_file_problem(path: Path | str) -> str | None:
    """Why ``path`` cannot be read as a file, found without opening it (a
    FIFO's open waits for a writer, forever); None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for is_kind, name in FILE_KINDS if is_kind(mode)), "a special file")
    return f"is {kind}, not a regular file; name a regular file"


def output_file_problem(path: Path | str, *, atomic: bool = True) -> str | None:
    """Why a file could not be written at ``path``, found before any work by
    writing an empty probe the same way; None when it can. ``atomic``: the
    way :func:`atomic_write_json` writes (a temporary file beside it, with a
    longer name, renamed over it); else the file opened in place (created
    and removed again when it was not there). ``path``'s folder must exist.
    Something there that is not a regular file (a folder, a FIFO, a device
    such as ``/dev/null``) is refused: the write would replace it, or wait
    for a reader."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there: its folder says why
        mode = None
    except OSError as exc:
        return f"cannot be looked up: {exc.strerror or exc}"
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((name for is_kind, name in FILE_KINDS if is_kind(mode)), "a special file")
        return f"is {kind}, not a regular file; name a regular file"
    folder = path.parent
    if not folder.is_dir():
        return f"its folder {folder} does not exist (or is not a folder); create it first"
    try:
        if atomic:
            handle, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
            os.close(handle)
            os.unlink(probe)
        elif mode is None:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.unlink(path)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # its content stays
    except OSError as exc:
        return (f"cannot be written in {folder}: {exc.strerror or exc}; name a file in a "
                "writable folder")
    return None
