"""``--c128a-known-failures FILE``: the checks a target is known to fail,
as strict expected failures.

The file lists one property or regression case a line, with the reason::

    # vLLM 0.34.0 held to inert: padding rows still publish slot ids (vllm#55177)
    padding: padding rows hold slot ids, not -1
    matches_oracle: the same rows, compared with the inert oracle
    matches_oracle-b839eb151f69.json: the kept packed-stride case
    not run: consumers: 0.30.0 ships no combine_topk_swa_indices

A line ``not run: NAME: reason`` accepts instead that NAME's tests do not
all run on this target (a consumer its release lacks): those that do not
run do not fail the run, and the summary names the line; one whose every
test ran here fails the run, as a stale line does. Its failures stay
failures.

A name is one the ``conformance`` marker carries: a property
(:func:`c128a.conformance.check_names`) or a case file's name; a case file
whose name holds a colon is found by its whole name (``a:b.json: reason``).
Blank lines and lines starting with ``#`` are comments; a UTF-8 byte-order
mark is ignored. A line without a reason, a name given twice or a name that
no check and no case has is a usage error naming the file and the line; so
is a path that is not a regular file (a FIFO would block the run for ever).

A listed check's failing tests are reported as xfailed with the reason (only
a failed assertion: a fault of the suite or an error in set-up stays an
error; a test that declares itself an expected failure counts too). A
listed check none of whose tests failed, though at least one ran and
passed, fails the run with one failed report per such line: the file
cannot go stale silently. So does a listed check whose tests were all
skipped for a reason other than a missing device or tool
(:mod:`c128a.conformance.requirements`): it did not run, so the file's
claim cannot be judged. A check whose tests were all deselected, or that
needs a device or tool missing here, is not judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from c128a.conformance.requirements import missing_requirement_of
from c128a.plugin.verdicts import skip_reason

PLUGIN_NAME = "c128a-known-failures"
REPORT_KEY = "c128a_known_failure"
"""Attribute of a test's call report, or of its set-up report when that
skipped: {"line": the file's line naming its check, "hit": whether its
failure was expected, "skipped": the reason when it did not run, "missing":
the device or tool the suite skipped it for}; xdist carries it to the
controller with the report."""
NOT_RUN_PREFIX = "not run:"
"""A line accepting that a check does not run: ``not run: NAME: reason``."""


SHOWN_PASSES = 3  # passed tests a stale line's report names


class KnownFailuresError(Exception):
    """A malformed known-failures file, or a name nothing carries."""


@dataclass(frozen=True)
class KnownFailure:
    name: str
    reason: str
    line: int
    not_run: bool = False
    """A ``not run:`` line: the check is accepted not to run, not to fail."""


def known_names(case_names: list[str]) -> set[str]:
    from c128a.conformance import check_names

    return {*check_names(), *case_names}


def split_line(line: str, names: set[str]) -> tuple[str, str, str]:
    """(name, colon, reason) of a stripped ``NAME: reason`` line: NAME is
    the longest of ``names`` the line starts with, followed by a colon (a
    case file's name may hold one), else all before the first colon."""
    for name in sorted(names, key=len, reverse=True):
        rest = line[len(name):].lstrip() if line.startswith(name) else ""
        if rest.startswith(":"):
            return name, ":", rest[1:].strip()
    name, colon, reason = line.partition(":")
    return name.strip(), colon, reason.strip()


def read_known_failures(path: Path, names: set[str]) -> dict[str, KnownFailure]:
    """{name: entry} of the file at ``path``; every name must be in ``names``."""
    from c128a.files import regular_file_problem

    # Looked at before opening it: opening a FIFO waits for a writer for ever.
    if path.exists() and (problem := regular_file_problem(path)) is not None:
        raise KnownFailuresError(f"{path} {problem}")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM some editors write is not a name
    except (OSError, UnicodeDecodeError) as exc:
        raise KnownFailuresError(f"cannot read {path}: {exc}") from None
    listed: dict[str, KnownFailure] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        not_run = line.startswith(NOT_RUN_PREFIX)
        name, colon, reason = split_line(line.removeprefix(NOT_RUN_PREFIX).strip(), names)
        where = f"{path}:{number}"
        if not colon or not name or not reason:
            raise KnownFailuresError(
                f"{where}: {raw.strip()!r} is not 'NAME: reason' (a property or case file "
                "name, a colon, and why it fails) or 'not run: NAME: reason'"
            )
        if name not in names:
            raise KnownFailuresError(
                f"{where}: {name!r} names no property and no regression case of this run; "
                f"properties: {', '.join(sorted(n for n in names if not n.endswith('.json')))}"
            )
        if name in listed:
            raise KnownFailuresError(f"{where}: {name!r} is listed already on line "
                                     f"{listed[name].line}")
        listed[name] = KnownFailure(name, reason, number, not_run)
    return listed


def expected(excinfo: pytest.ExceptionInfo | None) -> bool:
    """Whether a failure is the target's: a failed assertion (a contract
    violation, a check's ``assert``) or a test's ``pytest.fail``."""
    if excinfo is None:
        return False
    from c128a.failures import HarnessError, UsageError

    if excinfo.errisinstance((HarnessError, UsageError)):
        return False
    return excinfo.errisinstance((AssertionError, pytest.fail.Exception)) or (
        excinfo.errisinstance(BaseExceptionGroup)
        and all(isinstance(e, AssertionError) for e in excinfo.value.exceptions)
    )


class KnownFailures:
    """Turns the failures of listed checks into expected ones (in whichever
    process runs the test) and fails the run for each listed check that
    passed (in the controller, or the one process without xdist)."""

    def __init__(self, config: pytest.Config, listed: dict[str, KnownFailure]):
        self.path = config.getoption("c128a_known_failures")
        self.listed = listed
        self.by_line = {entry.line: entry for entry in listed.values()}
        self.hits: dict[int, int] = {}
        self.passes: dict[int, list[str]] = {}
        self.failures: dict[int, list[str]] = {}
        self.skips: dict[int, list[tuple[str, str, str | None]]] = {}
        self.in_worker = hasattr(config, "workerinput")

    def entry_of(self, item: pytest.Item) -> KnownFailure | None:
        marker = item.get_closest_marker("conformance")
        return self.listed.get(marker.args[0]) if marker and marker.args else None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        entry = self.entry_of(item)
        if entry is None or not (call.when == "call" or (call.when == "setup" and report.skipped)):
            return report
        declared = report.skipped and hasattr(report, "wasxfail")  # pytest.xfail, a marker
        hit = declared or (report.failed and expected(call.excinfo) and not entry.not_run)
        if hit and not declared:
            report.outcome = "skipped"
            report.wasxfail = f"known failure ({self.path}:{entry.line}): {entry.reason}"
        skipped = skip_reason(report) if report.skipped and not hit else None
        setattr(report, REPORT_KEY, {"line": entry.line, "hit": hit, "skipped": skipped,
                                     "missing": missing_requirement_of(call.excinfo)})
        return report

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        known = getattr(report, REPORT_KEY, None)
        if self.in_worker or not known or report.when not in ("setup", "call"):
            return
        if known["hit"]:
            self.hits[known["line"]] = self.hits.get(known["line"], 0) + 1
        elif report.passed:
            self.passes.setdefault(known["line"], []).append(report.nodeid)
        elif report.failed:
            self.failures.setdefault(known["line"], []).append(report.nodeid)
        elif known.get("skipped") is not None:
            self.skips.setdefault(known["line"], []).append(
                (report.nodeid, known["skipped"], known.get("missing")))

    def expected_failures(self) -> dict[int, KnownFailure]:
        return {line: entry for line, entry in self.by_line.items() if not entry.not_run}

    def accepted_not_run(self) -> dict[str, str]:
        """Check name -> ``FILE:LINE (reason)`` of each ``not run:`` line."""
        return {entry.name: f"{self.path}:{entry.line} ({entry.reason})"
                for entry in self.by_line.values() if entry.not_run}

    def _not_run_tests(self, line: int) -> list[tuple[str, str]]:
        """(test, reason) of the line's tests skipped for no missing device or tool."""
        return [(nodeid, why) for nodeid, why, missing in self.skips.get(line, ())
                if missing is None]

    def stale(self) -> list[tuple[KnownFailure, list[str]]]:
        """The listed checks that passed: no expected failure, a pass."""
        return [(self.by_line[line], nodeids) for line, nodeids in sorted(self.passes.items())
                if not self.hits.get(line) and not self.by_line[line].not_run]

    def not_run(self) -> list[tuple[KnownFailure, list[tuple[str, str]]]]:
        """The listed checks that did not run: none of their tests failed or
        passed, and some skipped for no missing device or tool."""
        judged = [(line, self._not_run_tests(line)) for line in sorted(self.skips)
                  if not self.hits.get(line) and line not in self.passes
                  and not self.by_line[line].not_run]
        return [(self.by_line[line], skips) for line, skips in judged if skips]

    def ran_though_accepted(self) -> list[tuple[KnownFailure, int]]:
        """The ``not run:`` lines whose every test ran here (none skipped
        for no missing device or tool): stale."""
        found = []
        for line, entry in sorted(self.by_line.items()):
            ran = len(self.passes.get(line, ())) + len(self.failures.get(line, ()))
            if entry.not_run and ran and not self._not_run_tests(line):
                found.append((entry, ran))
        return found

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        result = yield
        if self.in_worker:
            return result
        for entry, nodeids in self.stale():
            self._report_stale(session, entry, nodeids)
        for entry, skips in self.not_run():
            self._report_not_run(session, entry, skips)
        for entry, ran in self.ran_though_accepted():
            self._report_failed(session, entry, (
                f"{self.path}:{entry.line} accepts that {entry.name!r} does not run "
                f"({entry.reason}), but it ran: {ran} test(s) ran and none did not. Remove "
                "the line."))
        return result

    def _report_stale(self, session: pytest.Session, entry: KnownFailure, nodeids) -> None:
        where = f"{self.path}:{entry.line}"
        message = (
            f"{where} lists {entry.name!r} as a known failure ({entry.reason}), but it passed: "
            f"{len(nodeids)} test(s) passed and none failed. Remove the line.\n"
            + "\n".join(f"  passed: {nodeid}" for nodeid in nodeids[:SHOWN_PASSES])
            + (f"\n  and {len(nodeids) - SHOWN_PASSES} more" if len(nodeids) > SHOWN_PASSES else "")
        )
        self._report_failed(session, entry, message)

    def _report_not_run(self, session: pytest.Session, entry: KnownFailure, skips) -> None:
        where = f"{self.path}:{entry.line}"
        message = (
            f"{where} lists {entry.name!r} as a known failure ({entry.reason}), but it did not "
            f"run: {len(skips)} test(s) skipped, none failed or passed, so the line cannot be "
            "judged. Make it run here, or run the file where it does.\n"
            + "\n".join(f"  skipped: {nodeid}: {why}" for nodeid, why in skips[:SHOWN_PASSES])
            + (f"\n  and {len(skips) - SHOWN_PASSES} more" if len(skips) > SHOWN_PASSES else "")
        )
        self._report_failed(session, entry, message)

    def _report_failed(self, session: pytest.Session, entry: KnownFailure, message: str) -> None:
        nodeid = f"{self.path}::{entry.name}"
        for when, outcome, longrepr in (("call", "failed", message), ("teardown", "passed", None)):
            report = pytest.TestReport(
                nodeid=nodeid, location=(str(self.path), entry.line - 1, entry.name),
                keywords={}, outcome=outcome, longrepr=longrepr, when=when,
            )
            session.config.hook.pytest_runtest_logreport(report=report)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.in_worker:
            return
        stale = {entry.line for entry, _ in self.stale()}
        failing = self.expected_failures()
        counts = {
            "failed as expected": sum(1 for line in failing if self.hits.get(line)),
            "passed (stale)": len(stale),
            "not run": sum(1 for line in failing
                           if not self.hits.get(line) and line not in self.passes),
        }
        unjudged = len(self.not_run())
        accepted = len(self.by_line) - len(failing)
        ran = len(self.ran_though_accepted())
        terminalreporter.write_line(
            f"c128a known failures ({self.path}): {len(failing)} listed, "
            + ", ".join(f"{count} {what}" for what, count in counts.items())
            + (f" ({unjudged} of them skipped, which fails the run)" if unjudged else "")
            + (f"; {accepted} accepted not to run" if accepted else "")
            + (f" ({ran} of them ran, which fails the run)" if ran else "")
        )
