"""The verdict of a conformance run: what ran, what passed, what did not run,
and what does not apply to the target.

Every test carrying the ``conformance(NAME)`` marker is a check of the
target. At the end of the run one line counts them, e.g.::

    c128a conformance: 108 checks ran: 106 passed, 0 failed, 2 expected failures; 3 not run (CUDA: 3); 2 not applicable

and the lines under it name the checks that did not run and those that do
not apply. A check passes when its call passed (a set-up that passed and a
call that never reported, its process ended, is not a pass). A check the
suite skipped because a device or tool is missing
(:mod:`c128a.conformance.requirements`, told by the skip's class, not its
words) did not run for a reason the run can stand. A check skipped for any
other reason did not run on its target: the run fails, with one failed
report listing them, unless a known-failures file accepts it (``not run:
NAME: reason``, :mod:`c128a.plugin.known_failures`) or
``--c128a-allow-not-run`` (``$C128A_ALLOW_NOT_RUN=1``) allows every such
check. A check the target cannot have by its nature (marker
``applies_to``: no keyed launcher, no batch-invariant mode, no
``jit_functions``) is not applicable: deselected, listed, not a failure.
A run in which checks were selected and none ran checked nothing: it fails.
A check that did not run is never a pass.

Each process tags the reports of its conformance tests with the check's name
(:data:`REPORT_KEY`) and a skip of the suite's own with the device or tool
missing (:data:`MISSING_KEY`); xdist carries both to the controller, and
each worker's not-applicable checks in its ``workeroutput``. The controller,
or the one process without xdist, counts and judges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

import pytest

from c128a.conformance.requirements import missing_requirement_of

PLUGIN_NAME = "c128a-verdicts"
REPORT_KEY = "c128a_check"
"""Attribute of a conformance test's reports: the name its marker carries."""
MISSING_KEY = "c128a_missing"
"""Attribute of a report of the suite's own skip: the device or tool missing."""
NOT_APPLICABLE_KEY = "c128a_not_applicable"
"""``workeroutput`` entry of an xdist worker: its not-applicable checks."""
NOT_RUN_NODEID = "c128a::not_run"
"""The failed report that stands for the checks that did not run."""
NOTHING_CHECKED_NODEID = "c128a::nothing_checked"
"""The failed report of a run whose selected checks all did not run."""
OTHER = "other reasons"
"""The group of the checks that did not run for no missing device or tool."""
NEVER_REPORTED = ("its call never reported: the process running it ended first (a crash, "
                  "exit() or a timeout)")

PASSED, FAILED, EXPECTED, NOT_RUN, PENDING = (
    "passed", "failed", "expected failure", "not run", "pending")


def check_name(item: pytest.Item) -> str | None:
    """The name the item's ``conformance`` marker carries (None: not a check)."""
    marker = item.get_closest_marker("conformance")
    return str(marker.args[0]) if marker is not None and marker.args else None


def shown_id(report) -> str:
    """``test_module.py::test_name[params]``: what a reader finds the test by
    (a node id of ``--pyargs`` from outside the rootdir lacks the module)."""
    path, _, domain = report.location
    return f"{PurePath(path).name}::{domain}"


def shown_item(item: pytest.Item) -> str:
    return shown_id(item)


def skip_reason(report: pytest.TestReport) -> str:
    """The reason of a skipped report, without the ``Skipped:`` prefix pytest gives it."""
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr or "")
    return reason.removeprefix("Skipped: ").removeprefix("MissingRequirement: ")


@dataclass
class CheckOutcome:
    """One check's outcome as far as its reports so far tell (``pending``:
    no report of its call yet)."""

    name: str
    shown: str
    verdict: str = PENDING
    reason: str = ""
    missing: str | None = None
    """The device or tool whose absence the suite skipped it for."""


def outcome_of(report: pytest.TestReport, so_far: CheckOutcome) -> CheckOutcome:
    """``so_far`` updated with ``report``: a failure in any phase fails the
    check; a skip in set-up or in the call means it did not run (a skip with
    ``wasxfail`` is an expected failure, listed or declared); a passed call
    passes it."""
    if so_far.verdict == FAILED:
        return so_far
    if report.failed:
        return CheckOutcome(so_far.name, so_far.shown, FAILED)
    if report.skipped and hasattr(report, "wasxfail"):
        return CheckOutcome(so_far.name, so_far.shown, EXPECTED, str(report.wasxfail))
    if report.skipped:
        return CheckOutcome(so_far.name, so_far.shown, NOT_RUN, skip_reason(report),
                            getattr(report, MISSING_KEY, None))
    if report.passed and report.when == "call" and so_far.verdict == PENDING:
        return CheckOutcome(so_far.name, so_far.shown, PASSED)
    return so_far


@dataclass(frozen=True)
class NotApplicable:
    """A check deselected for the target (marker ``applies_to``)."""

    name: str
    shown: str
    why: str


@dataclass
class Tally:
    """The outcomes of the run's checks, by test id; the checks that do not
    apply; the not-run checks a known-failures file accepts."""

    outcomes: dict[str, CheckOutcome] = field(default_factory=dict)
    not_applicable: dict[str, NotApplicable] = field(default_factory=dict)
    accepted: dict[str, str] = field(default_factory=dict)
    """Check name -> where and why a known-failures file accepts its not running."""

    def add(self, nodeid: str, name: str, report: pytest.TestReport) -> None:
        so_far = self.outcomes.get(nodeid) or CheckOutcome(name, shown_id(report))
        self.outcomes[nodeid] = outcome_of(report, so_far)

    def close(self) -> None:
        """The run is over: a check whose call never reported did not run."""
        for nodeid, outcome in self.outcomes.items():
            if outcome.verdict == PENDING:
                self.outcomes[nodeid] = CheckOutcome(outcome.name, outcome.shown, NOT_RUN,
                                                     NEVER_REPORTED)

    def count(self, verdict: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.verdict == verdict)

    def ran(self) -> int:
        return self.count(PASSED) + self.count(FAILED) + self.count(EXPECTED)

    def not_run(self) -> dict[str, list[CheckOutcome]]:
        """{missing device or tool, or :data:`OTHER`: [outcome]}."""
        groups: dict[str, list[CheckOutcome]] = {}
        for outcome in self.outcomes.values():
            if outcome.verdict == NOT_RUN:
                groups.setdefault(outcome.missing or OTHER, []).append(outcome)
        return groups

    def unexcused(self) -> list[CheckOutcome]:
        """The checks that did not run for no missing device or tool, and
        that no known-failures line accepts."""
        return [o for o in self.not_run().get(OTHER, []) if o.name not in self.accepted]

    def nothing_checked(self) -> bool:
        """Checks were selected and none of them ran."""
        return bool(self.outcomes) and self.ran() == 0


def summary_line(tally: Tally) -> str:
    groups = tally.not_run()
    by_reason = ", ".join(f"{group}: {len(entries)}" for group, entries in sorted(
        groups.items(), key=lambda kv: (kv[0] == OTHER, kv[0])))
    line = (f"c128a conformance: {tally.ran()} checks ran: {tally.count(PASSED)} passed, "
            f"{tally.count(FAILED)} failed, {tally.count(EXPECTED)} expected failures; "
            f"{tally.count(NOT_RUN)} not run")
    line += f" ({by_reason})" if by_reason else ""
    return line + (f"; {len(tally.not_applicable)} not applicable" if tally.not_applicable
                   else "")


def not_run_lines(tally: Tally) -> list[str]:
    """What did not run: per missing device or tool the checks' names; each
    check that did not run for another reason with its test id and reason
    (and, where a known-failures line accepts it, that line); then what does
    not apply, by why."""
    lines = []
    for group, entries in sorted(tally.not_run().items(), key=lambda kv: (kv[0] == OTHER, kv[0])):
        if group == OTHER:
            lines += [f"  not run: {outcome.shown} ({outcome.name}): {outcome.reason}"
                      + (f" [accepted by {tally.accepted[outcome.name]}]"
                         if outcome.name in tally.accepted else "")
                      for outcome in entries]
        else:
            names = sorted({outcome.name for outcome in entries})
            lines.append(f"  not run ({group} missing): {', '.join(names)}")
    by_why: dict[str, list[NotApplicable]] = {}
    for entry in tally.not_applicable.values():
        by_why.setdefault(entry.why, []).append(entry)
    for why, entries in sorted(by_why.items()):
        names = sorted({entry.name for entry in entries})
        lines.append(f"  not applicable ({why}): {', '.join(names)} "
                     f"({len(entries)} test{'s' if len(entries) != 1 else ''})")
    return lines


def not_run_message(entries: list[CheckOutcome], allow_option: str, allow_env: str) -> str:
    return (
        f"{len(entries)} check(s) of the target did not run, for a reason other than a missing "
        "device or tool; a check that did not run is not a pass:\n"
        + "\n".join(f"  {o.shown} ({o.name}): {o.reason}" for o in entries)
        + "\nMake them run, deselect them (-k, -m), accept one in a known-failures file "
        f"('not run: NAME: reason'), or allow them all with {allow_option} (${allow_env}=1)."
    )


def nothing_checked_message(tally: Tally) -> str:
    groups = ", ".join(f"{group}: {len(entries)}" for group, entries in sorted(
        tally.not_run().items()))
    return (f"no check of the target ran: the {len(tally.outcomes)} selected did not run "
            f"({groups}); a run that checked nothing is not a pass. Run where they can "
            "(a GPU for the checks that need CUDA), or select checks that run here.")


def not_applicable_entry(item: pytest.Item, target) -> NotApplicable | None:
    """The item as a check that does not apply to ``target`` (None: it
    applies, or it is not a check)."""
    name = check_name(item)
    if name is None:
        return None
    for marker in item.iter_markers("applies_to"):
        if not marker.args[0](target):
            why = (marker.kwargs.get("why")
                   or f"not a check of this target: {marker.args[0].__name__}")
            return NotApplicable(name, shown_item(item), why)
    return None


def record_not_applicable(config: pytest.Config, items: list[pytest.Item], target) -> None:
    """Note the checks among ``items`` (deselected for ``target``) that do
    not apply to it: in this process's tally, and for the controller in an
    xdist worker's ``workeroutput``."""
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    entries = [entry for item in items if (entry := not_applicable_entry(item, target))]
    if plugin is not None:
        plugin.note_not_applicable(entries)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[NOT_APPLICABLE_KEY] = [(e.name, e.shown, e.why) for e in entries]


class Verdicts:
    """Tags conformance reports (every process) and, in the controller or
    the one process without xdist, counts them, fails the run for checks
    that did not run unless accepted or allowed, and prints the summary."""

    def __init__(self, config: pytest.Config, allow_not_run: tuple[bool, str]):
        from c128a.options import ALLOW_NOT_RUN_OPTION

        self.config = config
        self.option = ALLOW_NOT_RUN_OPTION
        self.allowed, self.allowed_from = allow_not_run
        self.in_worker = hasattr(config, "workerinput")
        self.tally = Tally()
        self.crashed: list[str] = []

    def accept_not_run(self, accepted: dict[str, str]) -> None:
        """Check name -> where and why a known-failures line accepts that it
        does not run (:mod:`c128a.plugin.known_failures`)."""
        self.tally.accepted.update(accepted)

    def note_not_applicable(self, entries: list[NotApplicable]) -> None:
        for entry in entries:
            self.tally.not_applicable[entry.shown] = entry

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        name = check_name(item)
        if name is not None:
            setattr(report, REPORT_KEY, name)
            missing = missing_requirement_of(call.excinfo)
            if missing is not None and report.skipped:
                setattr(report, MISSING_KEY, missing)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.in_worker:
            return
        name = getattr(report, REPORT_KEY, None)
        if name is None and report.nodeid in self.tally.outcomes:
            name = self.tally.outcomes[report.nodeid].name  # xdist's report of a crash
        if name is not None:
            self.tally.add(report.nodeid, name, report)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report, sched) -> None:
        """xdist: the worker running ``crashitem`` died (its report follows)."""
        self.crashed.append(crashitem)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """xdist: a worker's not-applicable checks (each worker collects the same)."""
        entries = getattr(node, "workeroutput", {}).get(NOT_APPLICABLE_KEY, ())
        self.note_not_applicable([NotApplicable(*entry) for entry in entries])

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        result = yield
        if self.in_worker:
            return result
        self.tally.close()
        unexcused = self.tally.unexcused()
        if unexcused and not self.allowed:
            self._report_failed(session, NOT_RUN_NODEID, "not_run", not_run_message(
                unexcused, self.option.pytest, self.option.env))
        elif self.tally.nothing_checked():  # however excused, accepted or allowed
            self._report_failed(session, NOTHING_CHECKED_NODEID, "nothing_checked",
                                nothing_checked_message(self.tally))
        return result

    @staticmethod
    def _report_failed(session: pytest.Session, nodeid: str, name: str, message: str) -> None:
        for when, outcome, longrepr in (("call", "failed", message), ("teardown", "passed", None)):
            report = pytest.TestReport(
                nodeid=nodeid, location=("c128a", None, name), keywords={},
                outcome=outcome, longrepr=longrepr, when=when,
            )
            session.config.hook.pytest_runtest_logreport(report=report)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.in_worker or not (self.tally.outcomes or self.tally.not_applicable):
            return
        terminalreporter.write_line(summary_line(self.tally))
        for line in not_run_lines(self.tally):
            terminalreporter.write_line(line)
        for nodeid in self.crashed:
            outcome = self.tally.outcomes.get(nodeid)
            shown = f"{outcome.shown} ({outcome.name})" if outcome else nodeid
            terminalreporter.write_line(f"  crashed: {shown}: the worker running it died; it "
                                        "did not pass")
        if self.tally.unexcused() and self.allowed:
            terminalreporter.write_line(
                f"  (allowed by {self.allowed_from}: the checks above did not run, and do not "
                "fail the run)"
            )
