"""The cases of a fuzz run: what is saved where, and what was saved before.

A worker reports its first failing example before it shrinks it
(:meth:`CaseBook.found`) and the shrunk failure once it is done
(:meth:`CaseBook.shrunk`): the first is saved at once, so that a stop or a
kill loses nothing found, and the shrunk one replaces it. A failure is known
by its case file's name (:func:`~c128a.cases.case_filename`: its
kind, target, property, inputs and variant), so a failure of another kind or
target is never taken for one saved before; a file already at that name
counts as the case saved only when it reads back as the same case, and any
other file there keeps its place while the case takes another name
(:func:`~c128a.cases.save_case`), which the run says. No copy of a
failure is removed before the case replacing it is on the disk.

A case the cases folder refuses (a full disk, a read-only or vanished
folder) is written at once to the first fallback folder that takes it
(:func:`fallback_folders`), and the run says where on stderr; when none
does, it is printed whole there at once. Either way the run tries the
cases folder again as it goes (:meth:`CaseBook.retry_unwritten`) and at its
end, and keeps the case whole in its report entry until it is there. A
finding never lives only in memory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from ...cases import Case, SavedCase, case_filename, rewrite_case, save_case

UNWRITTEN_FOLDER = "c128a-unwritten-cases"


def fallback_folders(report: str | None) -> list[Path]:
    """Where a case the cases folder refuses goes, in order: beside the
    run's report, the user's cache (``$XDG_CACHE_HOME``, else ``~/.cache``:
    ``c128a/unwritten-cases``), the temporary folder."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folders = [cache / "c128a" / "unwritten-cases", Path(tempfile.gettempdir()) / UNWRITTEN_FOLDER]
    if report:
        folders.insert(0, Path(report).parent / UNWRITTEN_FOLDER)
    return folders


def _quiet(text: str, case: Case | None = None) -> None:
    pass


class CaseBook:
    """The run's cases, saved in ``cases_dir`` and listed as report entries
    (:attr:`entries`). ``on_record`` is called after each case is recorded
    (``--exitfirst`` stops the run there)."""

    def __init__(self, cases_dir: Path | str, on_record: Callable[[], None] = lambda: None,
                 fallbacks: list[Path] = (), say: Callable[[str, Case | None], None] = _quiet):
        self.cases_dir = cases_dir
        self.on_record = on_record
        self.fallbacks = list(fallbacks)
        # say(text, case): a line for stderr, and the case to print whole with it, if any
        self.say = say
        self.unwritten: list[dict[str, Any]] = []  # entries whose case cases_dir refused
        self.entries: list[dict[str, Any]] = []
        self.seen: set[str] = set()  # the file names of the failures found in this run
        self.by_name: dict[str, dict[str, Any]] = {}  # file name -> the entry saving it
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
        self.save(case, entry)
        self.entries.append(entry)
        self.on_record()
        return entry

    def save(self, case: Case, entry: dict[str, Any]) -> None:
        """``case`` into the cases folder, else at once into a fallback folder."""
        try:
            saved = save_case(case, self.cases_dir)
            entry.update(path=str(saved.path), new=saved.new)
            self._say_passed_over(case, saved, entry)
            return
        except OSError as exc:
            keep_unwritten(entry, case, self.cases_dir, exc)
        self.unwritten.append(entry)
        problems = []
        for folder in self.fallbacks:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                saved = save_case(case, folder)
            except OSError as exc:
                problems.append(f"{folder}: {exc.strerror or exc}")
                continue
            entry["saved_elsewhere"] = str(saved.path)
            self.say(f"{case.kind} case could not be written to {entry['not_written']}; saved "
                     f"instead as {saved.path}; the run tries {self.cases_dir} again as it goes "
                     "and at its end", None)
            return
        self.say(f"{case.kind} case could not be written to {entry['not_written']}, nor "
                 f"elsewhere ({'; '.join(problems) or 'no fallback folder'}): here it is whole; "
                 f"the run tries {self.cases_dir} again as it goes and at its end", case)

    def _say_passed_over(self, case: Case, saved: SavedCase, entry: dict[str, Any]) -> None:
        """A case saved under another name than its own: which names were
        taken, by what (those files are left as they are)."""
        if saved.passed_over:
            entry["name_taken"] = "; ".join(saved.passed_over)
            self.say(f"{case.kind} case saved as {saved.path}: {entry['name_taken']}, which "
                     "is not this case and is left as it is", None)

    def retry_unwritten(self) -> None:
        """Try the cases folder again for each case it refused; one written
        there now leaves its fallback copy."""
        for entry in list(self.unwritten):
            case = Case.from_json(entry["case"])
            try:
                saved = save_case(case, self.cases_dir)
            except OSError:
                continue
            self._forget_unwritten(entry)
            elsewhere = entry.pop("saved_elsewhere", None)
            unshrunk = entry.pop("unshrunk_kept", None)
            refused = entry.pop("not_written")
            del entry["case"]
            entry.update(path=str(saved.path), new=saved.new,
                         written_late=f"at first refused: {refused}")
            copies = [copy for copy in (elsewhere, unshrunk) if copy]
            for copy in copies:  # the case is on the disk now: its copies go
                Path(copy).unlink(missing_ok=True)
            self.say(f"{case.kind} case written to {saved.path} now (refused before: {refused}"
                     + "".join(f"; its copy {copy} removed" for copy in copies) + ")", None)
            self._say_passed_over(case, saved, entry)

    def _forget_unwritten(self, entry: dict[str, Any], replacement=None) -> None:
        for index, unwritten in enumerate(self.unwritten):
            if unwritten is entry:
                if replacement is None:
                    del self.unwritten[index]
                else:
                    self.unwritten[index] = replacement
                return

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
        self.by_name[key] = self.record(case, shrunk=False)
        self.pending[worker] = (key, self.by_name[key])
        return True

    def shrunk(self, worker: int, case: Case) -> int:
        """Worker ``worker``'s shrunk failure: it replaces the unshrunk case
        the worker reported, once it is on the disk itself (until then the
        unshrunk copy stays). The change in the run's count of failures: 1
        for a failure not reported before, -1 for one that shrank to a
        failure already saved (its unshrunk copy goes), else 0."""
        key = case_filename(case)
        first_key, first = self.pending.pop(worker, (None, None))
        if first is not None and key == first_key:
            # The first failing example was minimal already (an explicit
            # example, or nothing left to shrink): its file gains the blob.
            first["shrunk"] = True
            if first.get("new") and first.get("path"):
                try:
                    rewrite_case(first["path"], case)
                except OSError as exc:
                    keep_unwritten(first, case, first["path"], exc)
            elif any(entry is first for entry in self.unwritten):
                first["case"] = case.to_json()
                if first.get("saved_elsewhere"):
                    try:
                        rewrite_case(first["saved_elsewhere"], case)
                    except OSError:
                        pass  # the unshrunk copy stays there; the report holds this one
            return 0
        if key in self.seen:
            if first and on_disk(self.by_name.get(key)):
                self.discard(first)
                return -1
            return 0  # its unshrunk copy stays: what it shrank to is not on the disk
        self.seen.add(key)
        entry = self.record(case, shrunk=True)
        self.by_name[key] = entry
        if first is None:  # no early report (a draw that failed, or a first failing
            # example that was not a contract violation)
            return 1
        self.entries.remove(entry)
        if on_disk(entry):
            self.discard(first, keep_entry=True)
            unshrunk = None
        else:  # only in the report (and on stderr): the unshrunk copy stays on the disk
            unshrunk = first.get("path") if first.get("new") else first.get("saved_elsewhere")
            self._forget_unwritten(first)
        first.clear()
        first.update(entry)
        if unshrunk:
            first["unshrunk_kept"] = unshrunk
        self.by_name[key] = first
        self._forget_unwritten(entry, replacement=first)
        return 0

    def discard(self, entry: dict[str, Any], keep_entry: bool = False) -> None:
        """Drop an unshrunk case: its file, when this run wrote it, and its entry."""
        if entry.get("new") and entry.get("path"):
            Path(entry["path"]).unlink(missing_ok=True)
        if entry.get("saved_elsewhere"):
            Path(entry["saved_elsewhere"]).unlink(missing_ok=True)
        self._forget_unwritten(entry)
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


def on_disk(entry: dict[str, Any] | None) -> bool:
    """Whether ``entry``'s case is in a file, read back (in the cases folder
    or a fallback folder), not only in the report."""
    return bool(entry and (entry.get("path") or entry.get("saved_elsewhere")))


def keep_unwritten(entry: dict[str, Any], case: Case, where, exc: OSError) -> None:
    """A case that could not be written: kept whole in its report entry, with
    where and why."""
    entry["not_written"] = f"{where}: {exc.strerror or exc}"
    entry["case"] = case.to_json()
