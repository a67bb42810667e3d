"""The end of a fuzz run: its report written first, then its summary printed.

The report file is written before a line of the summary, so that a signal
during the summary (or a stderr nobody reads) cannot cost it. A stop
signal at the end (:mod:`.signals`) cuts the summary short: the report is
written again, marked ``interrupted``, and one line says so and where the
report is. A report that cannot be written makes the run not clean (exit 2
unless something was found), and its cases are printed whole on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...cases import Case, case_filename
from ...files import atomic_write_json
from ..reach import pair_rows, reach_rows
from .config import FuzzConfig
from .report import (
    CASE_BLOCK,
    REPORT_CASES_BLOCK,
    RunState,
    print_for_saving_by_hand,
    summary_table,
    time_lines,
)
from .signals import RunInterrupted, RunSignals


def say(console, text: str, case: Case | None = None) -> None:
    """A line on stderr; with ``case``, the case whole, to save by hand."""
    console.print(text, markup=False, soft_wrap=True)
    if case is not None:
        print_for_saving_by_hand(console, CASE_BLOCK, case.to_json(),
                                 f"save it as {case_filename(case)} in a cases folder to replay it")


def write_report(run: RunState, config: FuzzConfig) -> dict[str, Any]:
    """The run's report, written to ``config.report``; a file that cannot be
    written sets ``run.report_problem`` (the report returned says so)."""
    report = run.report()
    if config.report:
        try:
            atomic_write_json(Path(config.report), report)
        except OSError as exc:
            run.report_problem = f"{config.report}: {exc.strerror or exc}"
            report = run.report()
    return report


def end_run(run: RunState, config: FuzzConfig, console, signals: RunSignals) -> dict[str, Any]:
    """Write the report, then print the summary; a stop signal meanwhile
    ends it as :func:`end_interrupted` says."""
    try:
        report = write_report(run, config)
        print_summary(report, config, console)
    except RunInterrupted as stop:
        return end_interrupted(run, config, console, signals, stop)
    return report


def end_interrupted(run: RunState, config: FuzzConfig, console, signals: RunSignals,
                    stop: RunInterrupted) -> dict[str, Any]:
    """A stop signal after the rounds: the report written (again), marked
    interrupted, and one line; further signals are only noted."""
    signals.only_note()
    if run.interrupted is None:
        run.interrupted = stop.signum
    report = write_report(run, config)
    if not config.report:
        where = "not asked for (no --report)"
    elif run.report_problem:
        where = f"NOT WRITTEN ({run.report_problem})"
    else:
        where = f"written to {config.report}, status {report['status']}"
    console.print(f"run interrupted by {stop.name} while it ended (report or summary); the "
                  f"report is {where}", markup=False, soft_wrap=True)
    if run.report_problem and report["cases"]:
        print_report_cases(report, console)
    return report


def what_did_not_run(report: dict[str, Any]) -> list[str]:
    """The summary's lines on what the run did not check: nothing at all
    (and why), the rounds it selected that got no example, the properties
    that do not apply to the target."""
    lines = []
    if report.get("nothing_checked"):
        lines.append(f"nothing checked: {report['nothing_checked']}; the run is not clean "
                     f"(exit {report['exit_status']})")
    by_why: dict[str, list[str]] = {}
    for name, why in report.get("not_run", {}).items():
        by_why.setdefault(why, []).append(name)
    for why, names in by_why.items():
        lines.append(f"not run: {', '.join(names)}: {why}")
    if by_why and report["status"] == "incomplete":
        lines.append(f"the run is not clean (exit {report['exit_status']}): a property it "
                     "selected was not checked")
    for name, why in report.get("not_applicable", {}).items():
        lines.append(f"not applicable: {name}: {why}")
    return lines


def print_report_cases(report: dict[str, Any], console) -> None:
    # The report held the unwritten cases whole: without it they exist only here.
    print_for_saving_by_hand(
        console, REPORT_CASES_BLOCK, report["cases"],
        "the report's cases; an entry with \"case\" holds a case that could not be "
        "written: save that value as a .json file to replay it",
    )


def print_summary(report: dict[str, Any], config: FuzzConfig, console) -> None:
    """The run's summary: the table, the time split, reach and coverage,
    then each case, where it is saved (or the whole of it, when the cases
    folder refused it), and what stopped the run."""
    report_problem = report.get("report_not_written")
    console.print(summary_table(report))
    if config.max_examples is not None and report["totals"]["examples"] > config.max_examples:
        # Hypothesis's max_examples bounds what it generates; a worker counts every example.
        console.print(
            f"examples: {report['totals']['examples']} ran for --max-examples "
            f"{config.max_examples}, which bounds the generated ones; on top came the contract's "
            "historical steps (each property's explicit examples, in every worker's first round "
            "of it) and the examples that shrank a failure", markup=False, soft_wrap=True,
        )
    for line in time_lines(report):
        console.print(line, markup=False, soft_wrap=True)
    console.print(reach_rows(report["reach"], title="reach (examples a bucket)"))
    if "reach_pairs" in report:
        console.print(pair_rows(report["reach_pairs"], title="reach in pairs (examples a cell)"))
    if report["coverage"]:
        console.print(
            "coverage: " + ", ".join(f"{k}: {v}" for k, v in report["coverage"].items()),
            markup=False,
        )
    for case in report["cases"]:
        if case["path"]:
            note = "new" if case["new"] else "already saved"
            console.print(f"{case['kind']} case ({note}): {case['path']}\n  {case['failure']}",
                          markup=False)
        elif case.get("not_written"):
            where = "with the report's cases below" if report_problem else "below and in the report"
            elsewhere = (f"; saved instead as {case['saved_elsewhere']}"
                         if case.get("saved_elsewhere") else "")
            console.print(f"{case['kind']} case NOT WRITTEN ({case['not_written']}{elsewhere}; "
                          f"kept whole {where})\n  {case['failure']}", markup=False)
        else:
            console.print(f"{case['kind']}: {case['failure']}", markup=False)
        for key in ("note", "outside_contract", "written_late"):
            if case.get(key):
                console.print(f"  {key.replace('_', ' ')}: {case[key]}", markup=False)
        if case.get("not_written") and not report_problem:
            print_for_saving_by_hand(
                console, CASE_BLOCK, case["case"],
                f"save it as {case_filename(Case.from_json(case['case']))} in a cases folder "
                "to replay it",
            )
    for error in report["errors"]:
        console.print(f"error of the suite itself: {error}", markup=False)
    for line in what_did_not_run(report):
        console.print(line, markup=False, soft_wrap=True)
    if report["error"]:
        console.print(f"run aborted: {report['error']}", markup=False)
    if report["interrupted_by"]:
        console.print(f"run interrupted by {report['interrupted_by']}", markup=False)
    if report_problem:
        console.print(f"could not write the report to {report_problem}: the run is not clean "
                      f"(exit {report['exit_status']})", markup=False)
    if report_problem and report["cases"]:
        print_report_cases(report, console)
