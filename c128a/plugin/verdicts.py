"""The verdict of a conformance run: what ran, what passed, what did not run.

Every test carrying the ``conformance(NAME)`` marker is a check of the
target. At the end of the run one line counts them, e.g.::

    c128a conformance: 110 checks ran: 108 passed, 0 failed, 2 expected failures; 3 not run (CUDA: 3)

and the lines under it name the checks that did not run. A check skipped
because a device or tool is missing (:mod:`c128a.conformance.requirements`)
did not run for a reason the run can stand. A check skipped for any other
reason did not run on its target: the run fails, with one failed report
listing them, unless ``--c128a-allow-not-run`` (or ``$C128A_ALLOW_NOT_RUN=1``)
allows it. A check that did not run is never a pass.

Each process tags the reports of its conformance tests with the check's name
(:data:`REPORT_KEY`; xdist carries it to the controller); the controller,
or the one process without xdist, counts and judges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

import pytest

from c128a.conformance.requirements import missing_requirement

PLUGIN_NAME = "c128a-verdicts"
REPORT_KEY = "c128a_check"
"""Attribute of a conformance test's reports: the name its marker carries."""
NOT_RUN_NODEID = "c128a::not_run"
"""The failed report that stands for the checks that did not run."""
OTHER = "other reasons"
"""The group of the checks that did not run for no missing device or tool."""

PASSED, FAILED, EXPECTED, NOT_RUN = "passed", "failed", "expected failure", "not run"


def check_name(item: pytest.Item) -> str | None:
    """The name the item's ``conformance`` marker carries (None: not a check)."""
    marker = item.get_closest_marker("conformance")
    return str(marker.args[0]) if marker is not None and marker.args else None


def shown_id(report: pytest.TestReport) -> str:
    """``test_module.py::test_name[params]``: what a reader finds the test by
    (a node id of ``--pyargs`` from outside the rootdir lacks the module)."""
    path, _, domain = report.location
    return f"{PurePath(path).name}::{domain}"


def skip_reason(report: pytest.TestReport) -> str:
    """The reason of a skipped report, without pytest's ``Skipped: ``."""
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr or "")
    return reason.removeprefix("Skipped: ")


@dataclass
class CheckOutcome:
    """One check's outcome as far as its reports so far tell."""

    name: str
    shown: str
    verdict: str = PASSED
    reason: str = ""


def outcome_of(report: pytest.TestReport, so_far: CheckOutcome) -> CheckOutcome:
    """``so_far`` updated with ``report``: a failure in any phase fails the
    check; a skip in set-up or in the call means it did not run (a skip with
    ``wasxfail`` is an expected failure, listed or declared)."""
    if so_far.verdict == FAILED:
        return so_far
    if report.failed:
        return CheckOutcome(so_far.name, so_far.shown, FAILED)
    if report.skipped and hasattr(report, "wasxfail"):
        return CheckOutcome(so_far.name, so_far.shown, EXPECTED, str(report.wasxfail))
    if report.skipped:
        return CheckOutcome(so_far.name, so_far.shown, NOT_RUN, skip_reason(report))
    return so_far


@dataclass
class Tally:
    """The outcomes of the run's checks, by test id."""

    outcomes: dict[str, CheckOutcome] = field(default_factory=dict)

    def add(self, nodeid: str, name: str, report: pytest.TestReport) -> None:
        so_far = self.outcomes.get(nodeid) or CheckOutcome(name, shown_id(report))
        self.outcomes[nodeid] = outcome_of(report, so_far)

    def count(self, verdict: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.verdict == verdict)

    def not_run(self) -> dict[str, list[CheckOutcome]]:
        """{missing device or tool, or :data:`OTHER`: [outcome]}."""
        groups: dict[str, list[CheckOutcome]] = {}
        for outcome in self.outcomes.values():
            if outcome.verdict == NOT_RUN:
                group = missing_requirement(outcome.reason) or OTHER
                groups.setdefault(group, []).append(outcome)
        return groups

    def unexcused(self) -> list[CheckOutcome]:
        """The checks that did not run for no missing device or tool."""
        return self.not_run().get(OTHER, [])


def summary_line(tally: Tally) -> str:
    ran = tally.count(PASSED) + tally.count(FAILED) + tally.count(EXPECTED)
    groups = tally.not_run()
    by_reason = ", ".join(f"{group}: {len(entries)}" for group, entries in sorted(
        groups.items(), key=lambda kv: (kv[0] == OTHER, kv[0])))
    line = (f"c128a conformance: {ran} checks ran: {tally.count(PASSED)} passed, "
            f"{tally.count(FAILED)} failed, {tally.count(EXPECTED)} expected failures; "
            f"{tally.count(NOT_RUN)} not run")
    return line + (f" ({by_reason})" if by_reason else "")


def not_run_lines(tally: Tally) -> list[str]:
    """What did not run: per missing device or tool the checks' names; each
    check that did not run for another reason with its test id and reason."""
    lines = []
    for group, entries in sorted(tally.not_run().items(), key=lambda kv: (kv[0] == OTHER, kv[0])):
        if group == OTHER:
            lines += [f"  not run: {outcome.shown} ({outcome.name}): {outcome.reason}"
                      for outcome in entries]
        else:
            names = sorted({outcome.name for outcome in entries})
            lines.append(f"  not run ({group} missing): {', '.join(names)}")
    return lines


def not_run_message(entries: list[CheckOutcome], allow_option: str, allow_env: str) -> str:
    return (
        f"{len(entries)} check(s) of the target did not run, for a reason other than a missing "
        "device or tool; a check that did not run is not a pass:\n"
        + "\n".join(f"  {o.shown} ({o.name}): {o.reason}" for o in entries)
        + f"\nMake them run, deselect them (-k, -m), or allow it with {allow_option} "
        f"(${allow_env}=1)."
    )


class Verdicts:
    """Tags conformance reports (every process) and, in the controller or
    the one process without xdist, counts them, fails the run for checks
    that did not run unless allowed, and prints the summary."""

    def __init__(self, config: pytest.Config, allow_not_run: tuple[bool, str]):
        from c128a.options import ALLOW_NOT_RUN_OPTION

        self.option = ALLOW_NOT_RUN_OPTION
        self.allowed, self.allowed_from = allow_not_run
        self.in_worker = hasattr(config, "workerinput")
        self.tally = Tally()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        name = check_name(item)
        if name is not None:
            setattr(report, REPORT_KEY, name)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = getattr(report, REPORT_KEY, None)
        if self.in_worker or name is None:
            return
        self.tally.add(report.nodeid, name, report)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        result = yield
        unexcused = self.tally.unexcused()
        if self.in_worker or not unexcused or self.allowed:
            return result
        message = not_run_message(unexcused, self.option.pytest, self.option.env)
        for when, outcome, longrepr in (("call", "failed", message), ("teardown", "passed", None)):
            report = pytest.TestReport(
                nodeid=NOT_RUN_NODEID, location=("c128a", None, "not_run"), keywords={},
                outcome=outcome, longrepr=longrepr, when=when,
            )
            session.config.hook.pytest_runtest_logreport(report=report)
        return result

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.in_worker or not self.tally.outcomes:
            return
        terminalreporter.write_line(summary_line(self.tally))
        for line in not_run_lines(self.tally):
            terminalreporter.write_line(line)
        if self.tally.unexcused() and self.allowed:
            terminalreporter.write_line(
                f"  (allowed by {self.allowed_from}: the checks above did not run, and do not "
                "fail the run)"
            )
