"""What a fuzz run shows and leaves: the live display, the JSON report and
the summary printed at its end.

The supervisor (:mod:`.supervisor`) counts; the functions here read its
counts (:class:`WorkerStats`, the coverage and reach tallies, the case book)
and render them.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ... import phases
from ...cases import versions
from ...failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from ...strategies.budget import size_budget
from ...strategies.pairs import pair_table
from ...strategies.reach import reach_table
from ..reach import pair_rows, reach_rows
from .casebook import CaseBook
from .config import FuzzConfig


REPORT_FORMAT = "c128a-fuzz-report/1"
NOTHING_CHECKED = "nothing checked"
"""The status of a run in which no example ran: not clean (exit 2)."""
INCOMPLETE = "incomplete"
"""The status of a run in which a round it selected (a property, the serving
loop) got no example: not clean (exit 2)."""
TIME_DETAIL = (*phases.PHASES, "inflight", "startup")
"""The report's ``time_detail``: the phases a worker measured (``draw`` is
Hypothesis's draw time, ``other`` the rest of the checks' own code), the
in-flight file writes and the start-ups (spawn to ready), both parts of
supervision."""


@dataclass
class WorkerStats:
    """One worker's counts and state, as the display and the report show them."""

    index: int
    gpu: int | None = None
    examples: int = 0
    failures: int = 0
    crashes: int = 0
    hangs: int = 0
    restarts: int = 0
    running: str = ""
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    state: str = "starting"
    seconds: Counter = field(default_factory=Counter)  # TIME_DETAIL name -> seconds

    def wall(self, now: float) -> float:
        return (self.finished or now) - self.started

    def rate(self, now: float) -> float:
        elapsed = self.wall(now)
        return self.examples / elapsed if elapsed > 0 else 0.0

    def time_split(self, now: float) -> dict[str, float]:
        return phases.split(self.seconds, self.wall(now))


class RunState(Protocol):
    """What the report reads of a run: the supervisor's state, named here so
    that the report imports nothing of the supervisor."""

    config: FuzzConfig
    stats: list[WorkerStats]
    labels: Counter[str]
    reach: Counter[str]
    per_property: Counter[str]
    book: CaseBook
    errors: list[str]
    fatal: str | None
    interrupted: int | None
    report_problem: str | None  # why the report file could not be written
    started: float
    started_wall: float
    deadline: float | None
    target_load_s: float | None  # how long the target took to load, before the workers

    def nothing_checked(self) -> str | None:
        """Why no example ran (None when one did)."""

    def not_run(self) -> dict[str, str]:
        """Each round the run selected that got no example, with why."""

    def not_applicable(self) -> dict[str, str]:
        """Each property selected that does not apply to the target, with why."""


def remaining(run: RunState, now: float) -> str:
    if run.deadline is None:
        return "-"
    return _duration(max(0.0, run.deadline - now))


def _budget(run: RunState):
    """The size budget of the run's device ("cuda:1" is a GPU's)."""
    return size_budget(str(run.config.device).partition(":")[0])


def render(run: RunState):
    """The live display: a row a worker, the reach table, coverage and the time split."""
    now = time.monotonic()
    table = Table(title=f"c128a fuzz: {run.config.target} on {run.config.device}",
                  title_justify="left")
    for column in ("worker", "state", "running", "examples", "ex/s", "failures",
                   "restarts", "elapsed", "remaining"):
        table.add_column(column, justify="right" if column in ("examples", "ex/s") else "left")
    for stats in run.stats:
        where = f"{stats.index}" + (f" (GPU {stats.gpu})" if stats.gpu is not None else "")
        table.add_row(
            where, stats.state, stats.running, str(stats.examples), f"{stats.rate(now):.1f}",
            str(stats.failures + stats.crashes + stats.hangs), str(stats.restarts),
            _duration(now - run.started), remaining(run, now),
        )
    parts = [table, reach_rows(reach_table(run.reach)),
             pair_rows(pair_table(run.reach, _budget(run)))]
    if run.labels:
        coverage = ", ".join(f"{label}: {n}" for label, n in sorted(run.labels.items()))
        parts.append(Text(f"coverage: {coverage}"))
    return Group(*parts, Text(f"time: {split_text(time_split(run, now))}"))


def time_split(run: RunState, now: float) -> dict[str, float]:
    """The workers' time split, added up."""
    total = dict.fromkeys(phases.BUCKETS, 0.0)
    for stats in run.stats:
        for name, spent in stats.time_split(now).items():
            total[name] += spent
    return total


def status_line(run: RunState, now: float) -> str:
    """The display's one-line form, logged every minute when there is no live display."""
    parts = [
        f"w{s.index} {s.state} {s.examples} ex {s.rate(now):.1f}/s "
        f"{s.failures + s.crashes + s.hangs} fail"
        for s in run.stats
    ]
    return (
        f"[{_duration(now - run.started)} / {remaining(run, now)} left] " + "; ".join(parts)
        + f"; time: {split_text(time_split(run, now))}"
    )


def build_report(run: RunState) -> dict[str, Any]:
    """The run's JSON report (:data:`REPORT_FORMAT`)."""
    now = time.monotonic()
    elapsed = now - run.started
    examples = sum(s.examples for s in run.stats)
    failures = sum(s.failures for s in run.stats)
    crashes = sum(s.crashes for s in run.stats)
    hangs = sum(s.hangs for s in run.stats)
    found = failures + crashes + hangs
    splits = [s.time_split(now) for s in run.stats]
    total_split = {name: sum(split[name] for split in splits) for name in phases.BUCKETS}
    # A report that could not be written makes no run clean: nothing else
    # says how the run went once the terminal is gone.
    errors = run.errors or getattr(run, "report_problem", None)
    # A run that checked nothing, or not every round it selected, is not
    # clean either: a check that did not run is not a pass.
    nothing_checked = run.nothing_checked() if not found else None
    not_run = run.not_run() if examples else {}
    if run.fatal:
        status = "aborted"
    elif run.interrupted is not None:
        status = "interrupted"
    elif found:
        status = "failures"
    elif errors:
        status = "errors"
    elif nothing_checked:
        status = NOTHING_CHECKED
    else:
        status = INCOMPLETE if not_run else "clean"
    if found:
        exit_status = EXIT_FAILED
    elif run.fatal or errors:
        exit_status = EXIT_USAGE
    elif run.interrupted is not None:
        exit_status = 128 + run.interrupted  # 130 SIGINT, 143 SIGTERM, 129 SIGHUP
    elif nothing_checked or not_run:
        exit_status = EXIT_USAGE
    else:
        exit_status = EXIT_OK
    return {
        "format": REPORT_FORMAT,
        "target": run.config.target,
        "padding_rows": run.config.padding_rows,
        "device": run.config.device,
        "seed": run.config.seed,
        "profile": run.config.profile,
        "workers": run.config.workers,
        "minutes": run.config.minutes,
        "max_examples": run.config.max_examples,
        "max_tokens": run.config.max_tokens,
        "database": run.config.db,
        "cases_dir": run.config.cases_dir,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(run.started_wall)),
        "elapsed_s": round(elapsed, 3),
        "status": status,
        "exit_status": exit_status,
        "interrupted_by": signal.Signals(run.interrupted).name if run.interrupted else None,
        "error": run.fatal,
        "errors": run.errors,
        "nothing_checked": nothing_checked,
        "not_run": not_run,
        "not_applicable": run.not_applicable(),
        "target_load_s": run.target_load_s,
        "report_not_written": getattr(run, "report_problem", None),
        "totals": {
            "examples": examples,
            "examples_per_s": round(examples / elapsed, 3) if elapsed else 0.0,
            "failures": failures,
            "crashes": crashes,
            "hangs": hangs,
            "restarts": sum(s.restarts for s in run.stats),
            "new_cases": run.book.new_cases,
            "worker_s": round(sum(s.wall(now) for s in run.stats), 3),
            "time_split": _rounded(total_split),
            "time_share": _rounded(phases.shares(total_split), 4),
            "time_detail": _rounded(
                {name: sum(s.seconds[name] for s in run.stats) for name in TIME_DETAIL}
            ),
        },
        "per_worker": [
            {
                "worker": s.index,
                "gpu": s.gpu,
                "examples": s.examples,
                "examples_per_s": round(s.rate(now), 3),
                "failures": s.failures,
                "crashes": s.crashes,
                "hangs": s.hangs,
                "restarts": s.restarts,
                "state": s.state,
                "elapsed_s": round(s.wall(now), 3),
                "time_split": _rounded(split),
                "time_share": _rounded(phases.shares(split), 4),
                "time_detail": _rounded({name: s.seconds[name] for name in TIME_DETAIL}),
            }
            for s, split in zip(run.stats, splits)
        ],
        "per_property": dict(sorted(run.per_property.items())),
        "coverage": dict(sorted(run.labels.items())),
        "reach": reach_table(run.reach),
        "reach_pairs": pair_table(run.reach, _budget(run)),
        "cases": run.book.entries,
        "versions": versions(),
    }


CASE_BLOCK = "c128a case that could not be written"
REPORT_CASES_BLOCK = "c128a report cases that could not be written"


def print_for_saving_by_hand(console, title: str, data: Any, how: str) -> None:
    """``data`` whole as JSON on stderr between BEGIN and END lines, so that a
    finding the disk refused can still be saved by hand: nothing wrapped,
    nothing coloured."""
    console.print(f"----- BEGIN {title} ({how}) -----", markup=False, highlight=False,
                  soft_wrap=True)
    console.print(json.dumps(data, indent=2), markup=False, highlight=False, soft_wrap=True)
    console.print(f"----- END {title} -----", markup=False, highlight=False, soft_wrap=True)


def _rounded(values: dict[str, float], digits: int = 3) -> dict[str, float]:
    return {name: round(value, digits) for name, value in values.items()}


def split_text(split: dict[str, float]) -> str:
    """``drawing 31% · target 22% · ...``: each bucket's share of the split."""
    share = phases.shares(split)
    return " · ".join(f"{name} {share[name]:.0%}" for name in phases.BUCKETS)


def time_lines(report: dict[str, Any]) -> list[str]:
    """The summary's time split: all workers' shares, the mean per example,
    where supervision went, then each worker's shares when there are several."""
    totals = report["totals"]
    if "time_split" not in totals:
        return []
    split, detail, workers = totals["time_split"], totals["time_detail"], report["per_worker"]
    per_example = 1e3 / max(totals["examples"], 1)
    supervision = split["supervision"]
    rest = max(supervision - detail["startup"] - detail["inflight"], 0.0)
    lines = [
        f"time: {split_text(split)}",
        "  per example: "
        + " · ".join(f"{name} {split[name] * per_example:.3g} ms" for name in phases.BUCKETS),
        f"  supervision {supervision:.1f} s of {totals['worker_s']:.1f} worker-s: start-up "
        f"{detail['startup']:.1f} s, in-flight files {detail['inflight']:.1f} s, the rest "
        f"{rest:.1f} s (Hypothesis's engine, shrinking, the database, messages)",
    ]
    if len(workers) > 1:
        lines += [
            f"  worker {row['worker']} ({row['elapsed_s']:.1f} s, {row['examples_per_s']:.1f} "
            f"ex/s): {split_text(row['time_split'])}"
            for row in workers
        ]
    return lines


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def summary_table(report: dict[str, Any]):
    steps = f", steps of up to {report['max_tokens']} tokens" if report.get("max_tokens") else ""
    table = Table(title=f"c128a fuzz summary: {report['target']} on {report['device']}, "
                  f"seed {report['seed']}{steps}, {report['elapsed_s']:.0f} s, {report['status']}",
                  title_justify="left")
    for column in ("worker", "examples", "ex/s", "failures", "crashes", "hangs", "restarts"):
        table.add_column(column, justify="right")
    for row in report["per_worker"]:
        table.add_row(str(row["worker"]), str(row["examples"]), f"{row['examples_per_s']:.1f}",
                      str(row["failures"]), str(row["crashes"]), str(row["hangs"]),
                      str(row["restarts"]))
    totals = report["totals"]
    table.add_row("all", str(totals["examples"]), f"{totals['examples_per_s']:.1f}",
                  str(totals["failures"]), str(totals["crashes"]), str(totals["hangs"]),
                  str(totals["restarts"]), style="bold")
    return table
