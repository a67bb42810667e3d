"""A generated table written into a documentation page between two markers
(``c128a mutants --update-docs PAGE``, ``c128a reach --update-docs PAGE``;
``--update-readme`` is the options' former name, kept as an alias).

The page is checked before the work that makes the table (a kill matrix
takes minutes): a regular file, readable UTF-8 text holding both markers,
in a folder where a file can be written. The new text is written aside,
in a temporary file beside it, and renamed over it: a full disk or a
read-only folder leaves the page as it was, never half written. Every
problem is a :class:`~c128a.failures.UsageError`: one line, exit status 2.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ..failures import UsageError
from ..files import output_file_problem, regular_file_problem

OPTION = "--update-docs"


def _marked_text(path: Path, start: str, end: str, what: str) -> tuple[str, re.Pattern]:
    """The page's text and the pattern of its marked region."""
    option = f"{OPTION} {path}"
    if not os.path.lexists(path):
        raise UsageError(f"{option}: no such file; name the docs page that holds the markers")
    if (problem := regular_file_problem(path)) is not None:
        raise UsageError(f"{option}: {problem}")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"{option}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option}: not UTF-8 text ({exc}); name the docs page") from None
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise UsageError(
            f"{option} has no {start} ... {end} markers; add them where {what} belongs"
        )
    return text, pattern


def check_page(path: Path, start: str, end: str, what: str) -> None:
    """Raise :class:`UsageError` unless :func:`update_page` could write
    ``path``: run it before the work that makes the table."""
    _marked_text(path, start, end, what)
    if (problem := output_file_problem(path)) is not None:
        raise UsageError(f"{OPTION} {path}: {problem}")


def update_page(path: Path, table: str, start: str, end: str, what: str) -> None:
    """Replace the text between the ``start`` and ``end`` markers of
    ``path`` with ``table``: written aside and renamed over it, with the
    page's own mode, so that it is either the old text or the new."""
    update_page_tables(path, [(table, start, end, what)])


def update_page_tables(path: Path, tables) -> None:
    """:func:`update_page` for several ``(table, start, end, what)`` at
    once, in one rename: the page holds all the new tables or none."""
    path = Path(path)
    new_text = None
    for table, start, end, what in tables:
        text, pattern = _marked_text(path, start, end, what)
        replacement = f"{start}\n{table}\n{end}"
        new_text = pattern.sub(lambda _: replacement, text if new_text is None else new_text,
                               count=1)
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(handle, "wb") as out:
            out.write(new_text.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, os.stat(path).st_mode & 0o7777)
        os.replace(temporary, path)
    except OSError as exc:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        raise UsageError(
            f"{OPTION} {path}: cannot write: {exc.strerror or exc}; the file is "
            f"unchanged; free space or make its folder {path.parent} writable"
        ) from None


# The names these functions had when the tables were written into the README.
check_readme = check_page
update_readme = update_page
update_readme_tables = update_page_tables
