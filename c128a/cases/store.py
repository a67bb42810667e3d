"""Saving a case to its file and loading it back.

A case is saved under its identity's name (:mod:`c128a.cases.identity`),
linked into place from a complete temporary file and read back, at most
:data:`MAX_CASE_BYTES` long; a file that is not the case is never
overwritten. Loading validates every field (:meth:`Case.from_json
<c128a.cases.format.Case.from_json>`) and names the first bad one.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..failures import CaseError
from ..files import readable_json, regular_file_problem, replace_with, written_temporary
from ..step.schema import to_json
from .format import Case, machine_steps_digest
from .identity import case_filename, case_identity, former_case_filename


MAX_CASE_BYTES = 64 << 20
"""The largest case file: :func:`load_case` reads no more, and a case is
never written larger (:func:`saved_form`). A 1M-context serving-loop step's
table is about 100 KB of it."""
KEPT_TEXT_CHARS = 32 << 10
"""What a case too large for :data:`MAX_CASE_BYTES` keeps of each end of
a text written for its reader (:data:`READERS_TEXTS`)."""
READERS_TEXTS = ("failure", "sanitizer_report", "steps")
"""The fields a case's replay does not run, in the order they are cut when
the case would be too large: the failure message, a sanitizer's report,
the steps as Hypothesis printed them."""


class CaseTooLarge(OSError):
    """A case that cannot be written within :data:`MAX_CASE_BYTES` even with
    its readers' texts cut: kept whole in the run's report instead."""


def _case_text(case: Case) -> str:
    """The case's JSON, readable where that fits in :data:`MAX_CASE_BYTES`,
    else without layout."""
    data = case.to_json()
    text = readable_json(data) + "\n"
    if _fits(text):
        return text
    return json.dumps(data, separators=(",", ":")) + "\n"


def _fits(text: str) -> bool:
    return len(text.encode()) <= MAX_CASE_BYTES


def _cut(text: str) -> str:
    cut = len(text) - 2 * KEPT_TEXT_CHARS
    return (f"{text[:KEPT_TEXT_CHARS]}\n[... {cut:,} characters cut here: the case would "
            f"have been larger than MAX_CASE_BYTES={MAX_CASE_BYTES:,}, the most `c128a replay` "
            f"reads ...]\n{text[-KEPT_TEXT_CHARS:]}")


def saved_form(case: Case) -> tuple[Case, str]:
    """``case`` as its file holds it, and the file's text, at most
    :data:`MAX_CASE_BYTES` (what :func:`load_case` reads): its
    ``machine_steps`` with their digest; where it would be larger, without
    layout, then with the middle of each reader's text cut (the failure
    message first), then, for a serving-loop case with a reproduce blob
    (which drives the same steps again: :func:`~c128a.cases.rerun.machine_steps_from_blob`),
    without its recorded steps. A case larger still raises
    :class:`CaseTooLarge`."""
    if case.machine_steps is not None:
        case = dataclasses.replace(
            case, machine_steps_digest=machine_steps_digest(to_json(case.machine_steps))
        )
    text = _case_text(case)
    for name in READERS_TEXTS:
        value = getattr(case, name)
        if _fits(text) or value is None or len(value) <= 2 * KEPT_TEXT_CHARS + 200:
            continue
        case = dataclasses.replace(case, **{name: _cut(value)})
        text = _case_text(case)
    if not _fits(text) and case.machine_steps is not None and case.reproduce_blob:
        steps = len(case.machine_steps.steps)
        case = dataclasses.replace(
            case, machine_steps=None, machine_steps_digest=None,
            failure=f"{case.failure}\n[its {steps} recorded engine step(s) were left out: with "
            f"them the case was larger than MAX_CASE_BYTES={MAX_CASE_BYTES:,}; it replays from "
            f"its reproduce_blob under hypothesis {case.versions.get('hypothesis', '?')}]",
        )
        text = _case_text(case)
    if not _fits(text):
        raise CaseTooLarge(
            errno.EFBIG, f"the {case.kind} case is {len(text.encode()):,} bytes even with its "
            f"readers' texts cut, more than MAX_CASE_BYTES={MAX_CASE_BYTES:,} (what c128a replay "
            "reads)"
        )
    return case, text


# ---------------------------------------------------------------- saving a case


OTHER_NAMES = 99
"""How many other names (``NAME-2.json`` ...) a case may take when files that
are not it hold its own."""


@dataclass(frozen=True)
class SavedCase:
    """Where :func:`save_case` saved a case: ``new`` False when the same case
    was there already; ``passed_over``: each name it could not take, with
    what holds it."""

    path: Path
    new: bool
    passed_over: tuple[str, ...] = ()


def _case_names(case: Case) -> list[str]:
    name = case_filename(case)
    stem = name.removesuffix(".json")
    return [name, *(f"{stem}-{number}.json" for number in range(2, OTHER_NAMES + 2))]


def _what_is_at(path: Path, case: Case) -> str | None:
    """What holds ``path`` in ``case``'s place: None when it is ``case``
    itself (a file that reads back as a case of the same identity), "" when
    nothing is there, else a description of what is."""
    if not os.path.lexists(path):
        return ""
    if os.path.islink(path) and not os.path.exists(path):
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    try:
        found = load_case(path)
    except CaseError as exc:
        return _recognised_file(path) or f"no case (field {exc.field!r}: {exc.rule})"
    if found.property == case.property and case_identity(found) == case_identity(case):
        return None
    return f"another case ({found.kind} of {found.property} on {found.target})"


def _recognised_file(path: Path) -> str | None:
    """What a file that is no case is, where its start says so."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(1 << 16)
    except OSError:
        return None
    if start.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer, not the case it stands for (git lfs pull fetches it)"
    if start.startswith(b"<<<<<<< ") or b"\n<<<<<<< " in start:
        return "a file with merge-conflict markers (<<<<<<<)"
    return None


def _read_back(path: Path, text: str) -> None:
    """``path`` holds ``text``, read from the disk again; else OSError."""
    try:
        with open(path, "rb") as handle:
            written = handle.read(MAX_CASE_BYTES + 1)
    except OSError as exc:
        raise OSError(exc.errno, f"{path} was written but cannot be read back: "
                      f"{exc.strerror or exc}") from exc
    if written != text.encode():
        raise OSError(errno.EIO, f"{path} was written but does not read back as written")


def save_case(case: Case, cases_dir: Path | str) -> SavedCase:
    """Save ``case`` (its :func:`saved_form`) in ``cases_dir`` under its name
    (:func:`case_filename`): new, or not when a file there reads back as the
    same case (by its identity), or one under the name it had before kind
    and target were part of it. A file there that is not the case (no case
    at all, another case, a dangling link, a Git LFS pointer, a merge
    conflict) is left as it is, and the case takes the next free name
    ``NAME-2.json``, ``NAME-3.json`` ... (``passed_over`` says why). The file
    is linked into place from a complete temporary file, so of several runs
    sharing ``cases_dir`` exactly one claims it new and no reader sees half a
    file, then read back: a case said saved is on the disk. OSError when it
    cannot be (a full disk, an unwritable folder, :class:`CaseTooLarge`)."""
    form, text = saved_form(case)
    folder = Path(cases_dir)
    names = _case_names(form)
    former = former_case_filename(form)
    if former is not None and _what_is_at(folder / former, form) is None:
        return SavedCase(folder / former, False)
    passed_over: list[str] = []
    temporary: Path | None = None
    try:
        for name in names:
            path = folder / name
            holder = _what_is_at(path, form)
            if holder == "":
                temporary = temporary or written_temporary(path, text)
                try:
                    os.link(temporary, path)
                except FileExistsError:  # another run, this moment
                    holder = _what_is_at(path, form)
                else:
                    _read_back(path, text)
                    return SavedCase(path, True, tuple(passed_over))
            if holder is None:
                return SavedCase(path, False, tuple(passed_over))
            passed_over.append(f"{name} holds {holder or 'a file that came and went'}")
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
    raise OSError(errno.EEXIST, f"{names[0]} and its {OTHER_NAMES} other names in {folder} are "
                  "all held by files that are not this case")


def write_case(case: Case, cases_dir: Path | str) -> tuple[Path, bool]:
    """:func:`save_case`'s (path, new)."""
    saved = save_case(case, cases_dir)
    return saved.path, saved.new


def rewrite_case(path: Path | str, case: Case) -> None:
    """Replace the case file at ``path`` (one this run wrote) with ``case``,
    whole or not at all, and read it back."""
    _, text = saved_form(case)
    replace_with(Path(path), text)
    _read_back(Path(path), text)




def load_case(path: Path | str) -> Case:
    """Read and validate one case file; anything wrong with it is a
    :class:`~c128a.failures.CaseError` naming the file, the field and the rule."""
    if (problem := regular_file_problem(path)) is not None:
        raise CaseError(path, "<file>", problem)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CASE_BYTES + 1)
    except OSError as exc:
        raise CaseError(path, "<file>", f"cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_CASE_BYTES:
        raise CaseError(path, "<file>", f"larger than {MAX_CASE_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CaseError(path, "<file>", f"not UTF-8 text: {exc}") from exc
    try:
        data = json.loads(text, object_pairs_hook=_object_with_unique_keys)
    except json.JSONDecodeError as exc:
        raise CaseError(path, "<file>", f"not JSON: {exc}") from exc
    except _DuplicateKey as exc:
        raise CaseError(
            path, exc.key, "appears twice in one JSON object; a reader keeps only one of the two "
            "values, so the file does not say which it means: keep one"
        ) from None
    except RecursionError:
        raise CaseError(path, "<file>", "JSON nested too deeply") from None
    try:
        return Case.from_json(data, path)
    except RecursionError:
        raise CaseError(path, "<file>", "JSON nested too deeply") from None


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key
        super().__init__(key)


def _object_with_unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice (json keeps the last silently)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key)
        data[key] = value
    return data


def case_files(cases_dir: Path | str) -> list[Path]:
    """Every ``*.json`` case in ``cases_dir``, sorted (stable test ids)."""
    return sorted(Path(cases_dir).glob("*.json"))
