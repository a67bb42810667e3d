"""The cases of a fuzz run: what is saved where, and what was saved before.

A worker reports its first failing example before it shrinks it
(:meth:`CaseBook.found`) and the shrunk failure once it is done
(:meth:`CaseBook.shrunk`): the first is saved at once, so that a stop or a
kill loses nothing found, and the shrunk one replaces it. A failure is known
by its case file's name (:func:`~c128a.runners.cases.case_filename`: its
kind, target, property, inputs and variant), so a failure of another kind or
target is never taken for one saved before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..cases import Case, atomic_write_json, case_filename, write_case


class CaseBook:
    """The run's cases, saved in ``cases_dir`` and listed as report entries
    (:attr:`entries`). ``on_record`` is called after each case is recorded
    (``--exitfirst`` stops the run there)."""

    def __init__(self, cases_dir: Path | str, on_record: Callable[[], None] = lambda: None):
        self.cases_dir = cases_dir
        self.on_record = on_record
        self.entries: list[dict[str, Any]] = []
        self.seen: set[str] = set()  # the file names of the failures found in this run
        # worker -> (file name, report entry) of its unshrunk case; no entry:
        # a failure found before, replayed from the database
        self.pending: dict[int, tuple[str, dict[str, Any] | None]] = {}

    def record(self, case: Case, **notes) -> dict[str, Any]:
        """Save ``case`` and list it. A case that cannot be written (disk
        full, a folder gone) is kept whole in its entry, with where and why it
        could not be written; the run goes on."""
        entry: dict[str, Any] = {"path": None, "property": case.property, "kind": case.kind,
                                 "new": False, "failure": case.failure.splitlines()[0][:300],
                                 **notes}
        if case.outside_contract is not None:
            entry["outside_contract"] = case.outside_contract
        try:
            path, new = write_case(case, self.cases_dir)
            entry.update(path=str(path), new=new)
        except OSError as exc:
            keep_unwritten(entry, case, self.cases_dir, exc)
        self.entries.append(entry)
        self.on_record()
        return entry

    def lost(self, kind: str, failure: str) -> None:
        """A crash or hang whose input is unknown: listed, nothing to save."""
        self.entries.append({"path": None, "property": None, "kind": kind, "new": False,
                             "failure": failure})

    def found(self, worker: int, case: Case) -> bool:
        """Worker ``worker``'s first failing example, before it shrinks:
        saved now. Whether it is a new failure of this run (one found before
        is a failure the database replayed)."""
        key = case_filename(case)
        if key in self.seen:
            self.pending[worker] = (key, None)
            return False
        self.seen.add(key)
        self.pending[worker] = (key, self.record(case, shrunk=False))
        return True

    def shrunk(self, worker: int, case: Case) -> int:
        """Worker ``worker``'s shrunk failure: it replaces the unshrunk case
        the worker reported. The change in the run's count of failures: 1 for
        a failure not reported before, -1 for one that shrank to a failure
        already found (its unshrunk copy goes), else 0."""
        key = case_filename(case)
        first_key, first = self.pending.pop(worker, (None, None))
        if first is not None and key == first_key:
            # The first failing example was minimal already (an explicit
            # example, or nothing left to shrink): its file gains the blob.
            first["shrunk"] = True
            if first.get("new") and first.get("path"):
                try:
                    atomic_write_json(Path(first["path"]), case.to_json())
                except OSError as exc:
                    keep_unwritten(first, case, first["path"], exc)
            return 0
        if key in self.seen:
            if first:
                self.discard(first)
                return -1
            return 0
        self.seen.add(key)
        if first is None:  # no early report (a draw that failed, or a first failing
            # example that was not a contract violation)
            self.record(case, shrunk=True)
            return 1
        entry = self.record(case, shrunk=True)
        self.entries.remove(entry)
        self.discard(first, keep_entry=True)
        first.clear()
        first.update(entry)
        return 0

    def discard(self, entry: dict[str, Any], keep_entry: bool = False) -> None:
        """Drop an unshrunk case: its file, when this run wrote it, and its entry."""
        if entry.get("new") and entry.get("path"):
            Path(entry["path"]).unlink(missing_ok=True)
        if not keep_entry:
            self.entries.remove(entry)

    def cut_short(self, worker: int, why: str, last_tried: Any = None) -> None:
        """Worker ``worker`` ended with an unshrunk failure: that first
        failing example stays saved, and says so; ``last_tried`` (the batch
        it ran last, as JSON) goes in its entry."""
        _, first = self.pending.pop(worker, (None, None))
        if first:
            first["shrunk"] = False
            first["note"] = f"shrinking was cut short ({why}); the case is the first failing example"
            if last_tried:
                first["last_tried"] = last_tried

    def has_unshrunk(self, worker: int) -> bool:
        return bool(self.pending.get(worker, (None, None))[1])

    @property
    def new_cases(self) -> int:
        return sum(1 for entry in self.entries if entry["new"])


def keep_unwritten(entry: dict[str, Any], case: Case, where, exc: OSError) -> None:
    """A case that could not be written: kept whole in its report entry, with
    where and why."""
    entry["not_written"] = f"{where}: {exc.strerror or exc}"
    entry["case"] = case.to_json()
