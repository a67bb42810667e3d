"""What a mutation run found: each mutant's outcome, the score, the verdict.

A mutant is *detected* when a property's check failed on it (``killed``, a
contract violation, as in the kill matrix), when its process died
(``crashed``) or when it ran a property past its time limit (``timed
out``). The last two count because the contract's function must return its
views: a build that takes the engine's process down, or never returns,
fails the engine as surely as a wrong value (the taxonomy counts a target
that raises where a result is expected as a kill,
:class:`~c128a.failures.TargetRaised`). They are shown apart from the
kills, with the exit status and the log's last line, or the property and
the limit.

The contract says nothing of time, though, and a limit cannot tell a build
that never returns from one that is merely slow. The limit is a multiple of
the unmutated kernel's own time for the same property on the same draws
(the control), so a mutant is never counted for being somewhat slower; one
that is much slower but right (it redoes work) is listed in the known
mutants, and a listed mutant that times out counts as what the list says
(equivalent or a survivor), not as detected. A listed mutant killed by a
check or crashed is a contradiction of the list (strict).

``error`` (a fault of the suite in some property, and no kill) is neither
a kill nor a survival: it is named, and fails the run as the suite's own
fault (exit status 2). ``not run``: the run was interrupted first.

The score is detected / (mutants run - equivalents).
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field

from ...failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .known import EQUIVALENT, SURVIVES, KnownMutant
from .mutator import Mutant

KILLED, TIMED_OUT, CRASHED = "killed", "timed out", "crashed"
SURVIVED, ERROR, NOT_RUN = "survived", "error", "not run"
DETECTED = (KILLED, TIMED_OUT, CRASHED)
STATUSES = (*DETECTED, SURVIVED, ERROR, NOT_RUN)


@dataclass
class Result:
    """One mutant's outcome: ``status``, and for a detected one the run and
    property that detected it; ``seconds`` its process's wall time;
    ``detail`` the check's message, the time limit, or how the process
    ended; ``errors`` the suite's own faults met on the way; ``properties``
    each property it met, in order: run, property, status, seconds."""

    mutant: Mutant
    status: str = NOT_RUN
    run: str = ""
    property: str = ""
    seconds: float = 0.0
    detail: str = ""
    errors: list[str] = field(default_factory=list)
    properties: list[tuple[str, str, str, float]] = field(default_factory=list)


@dataclass
class Verdict:
    """The results judged against the known mutants."""

    results: list[Result]
    known: dict[str, KnownMutant]
    generated: set[str]  # every id the subjects have (a sample or --mutant runs fewer)
    subjects: set[str] | None = None  # the subjects run (None: every listed id's)
    interrupted: str = ""

    def listed(self, result: Result) -> KnownMutant | None:
        return self.known.get(result.mutant.id)

    def category(self, result: Result) -> str:
        """``detected``, ``equivalent``, ``survived``, ``error`` or ``not run``:
        the outcome read with the list (a listed mutant that timed out is
        what the list says it is)."""
        entry = self.listed(result)
        if result.status in (KILLED, CRASHED) or (result.status == TIMED_OUT and entry is None):
            return "detected"
        if result.status in (SURVIVED, TIMED_OUT):
            return EQUIVALENT if entry is not None and entry.kind == EQUIVALENT else SURVIVED
        return result.status

    def in_category(self, category: str) -> list[Result]:
        return [r for r in self.results if self.category(r) == category]

    def equivalents(self) -> list[Result]:
        return self.in_category(EQUIVALENT)

    def survivors(self) -> list[Result]:
        return self.in_category(SURVIVED)

    def with_status(self, *statuses: str) -> list[Result]:
        return [r for r in self.results if r.status in statuses]

    def counts(self) -> dict[str, int]:
        """Each status, and each category (``detected``, ``equivalent``,
        ``survived``: read with the list), and how many ran."""
        counts = {status: len(self.with_status(status)) for status in STATUSES}
        for category in ("detected", EQUIVALENT, SURVIVED):
            counts[category] = len(self.in_category(category))
        counts["run"] = len(self.results) - counts[NOT_RUN]
        return counts

    def score(self) -> float | None:
        counts = self.counts()
        judged = counts["run"] - counts["equivalent"]
        return counts["detected"] / judged if judged else None

    def stale(self) -> list[KnownMutant]:
        """Listed mutants of the subjects run that the subjects no longer have."""
        return [entry for entry in self.known.values() if entry.id not in self.generated
                and (self.subjects is None or entry.id.rpartition("-")[0] in self.subjects)]

    def problems(self) -> list[str]:
        """Why the run fails: a survivor nobody listed, a listed mutant that
        was detected or no longer exists, a fault of the suite, mutants that
        did not run."""
        found = []
        for result in self.results:
            entry = self.listed(result)
            if self.category(result) == SURVIVED and entry is None:
                found.append(f"{result.mutant.id} survived, and is not listed as known: "
                             f"{result.mutant.describe()}")
            elif result.status in (KILLED, CRASHED) and entry is not None:
                found.append(
                    f"{result.mutant.id} is listed as {entry.kind} (line {entry.line}) but "
                    f"{'was killed' if result.status == KILLED else result.status} "
                    f"({where(result)}): remove it from the list"
                )
            elif result.status == ERROR:
                found.append(f"{result.mutant.id}: the suite itself failed: "
                             f"{'; '.join(result.errors) or result.detail}")
        for entry in self.stale():
            found.append(f"{entry.id} is listed as {entry.kind} (line {entry.line}) but no "
                         "subject has it any more: remove it from the list")
        not_run = self.with_status(NOT_RUN)
        if not_run:
            found.append(f"{len(not_run)} mutants did not run"
                         + (f" ({self.interrupted})" if self.interrupted else ""))
        return found

    def exit_status(self) -> int:
        if self.with_status(ERROR):
            return EXIT_USAGE
        return EXIT_FAILED if self.problems() else EXIT_OK


def where(result: Result) -> str:
    if result.status == KILLED:
        return f"{result.property} on {result.run}"
    if result.status == TIMED_OUT:
        return f"{result.property} on {result.run}, {result.detail}"
    return result.detail


def score_text(score: float | None) -> str:
    return "n/a" if score is None else f"{100 * score:.1f}%"


def text_report(verdict: Verdict, header: dict) -> str:
    """The report for a person: the score line, then the survivors (with
    their source line), the equivalents, the timeouts and crashes, the
    errors and what did not run; each mutant by id."""
    counts = verdict.counts()
    lines = [
        f"c128a mutate, {header['date']} on {header['machine']}",
        f"subjects: {', '.join(header['subjects'])}; mutants: {header['selection']}; "
        f"device: {header['device']}; examples: {header['max_examples']}; "
        f"time limit: {header['time_limit']}",
        *(f"judged by ({name}): " + "; ".join(
            f"{run['target']}: {', '.join(run['properties'])}" for run in runs)
          for name, runs in header["runs"].items()),
        f"mutation score {score_text(verdict.score())}: {counts['detected']} detected "
        f"({counts[KILLED]} killed by a check, "
        f"{counts['detected'] - counts[KILLED] - counts[CRASHED]} timed out, "
        f"{counts[CRASHED]} crashed) of {counts['run']} run - {counts['equivalent']} "
        f"equivalent; {counts['survived']} survived, {counts[ERROR]} errors, "
        f"{counts[NOT_RUN]} not run; wall time {header['wall_s']:.0f} s with "
        f"{header['workers']} workers",
    ]

    def section(title: str, results: list[Result], show) -> None:
        if not results:
            return
        lines.extend(["", f"{title} ({len(results)}):"])
        for result in results:
            mutant = result.mutant
            lines.append(f"  {mutant.id}  {mutant.describe()}")
            lines.append(f"      line {mutant.line}: {mutant.source_line}")
            lines.extend(f"      {text}" for text in show(result))

    def listed(result: Result) -> list[str]:
        entry = verdict.listed(result)
        return [f"listed ({entry.kind}): {entry.reason}"] if entry else ["not listed"]

    section("survived", verdict.survivors(), listed)
    section("equivalent (listed)", verdict.equivalents(), listed)
    section("timed out", verdict.with_status(TIMED_OUT), lambda r: [where(r), *(
        [f"listed ({e.kind}): {e.reason}"] if (e := verdict.listed(r)) else [])])
    section("crashed", verdict.with_status(CRASHED), lambda r: [r.detail])
    section("errors (faults of the suite, not kills)", verdict.with_status(ERROR),
            lambda r: r.errors or [r.detail])
    not_run = verdict.with_status(NOT_RUN)
    if not_run:
        lines.extend(["", f"not run ({len(not_run)}): " + " ".join(r.mutant.id for r in not_run)])
    by_check: dict[str, int] = {}
    for result in verdict.with_status(KILLED):
        key = f"{result.property} on {result.run}"
        by_check[key] = by_check.get(key, 0) + 1
    if by_check:
        lines.extend(["", "first kill by:"])
        lines.extend(f"  {count:4d}  {key}" for key, count in
                     sorted(by_check.items(), key=lambda item: -item[1]))
    problems = verdict.problems()
    lines.extend(["", "problems:" if problems else "problems: none"])
    lines.extend(f"  {problem}" for problem in problems)
    return "\n".join(lines) + "\n"


def json_report(verdict: Verdict, header: dict) -> str:
    counts = verdict.counts()
    mutants = []
    for result in verdict.results:
        entry = verdict.listed(result)
        record = {key: value for key, value in asdict(result).items() if key != "mutant"}
        mutant = result.mutant
        record.update(
            id=mutant.id, subject=mutant.subject, function=mutant.function, kind=mutant.kind,
            line=mutant.line, column=mutant.column, source_line=mutant.source_line,
            original=mutant.original, replacement=mutant.replacement,
            listed=None if entry is None else {"kind": entry.kind, "reason": entry.reason},
        )
        mutants.append(record)
    document = {
        **header,
        "score": verdict.score(),
        "counts": counts,
        "problems": verdict.problems(),
        "stale": [asdict(entry) for entry in verdict.stale()],
        "mutants": mutants,
    }
    return json.dumps(document, indent=1) + "\n"


def machine() -> str:
    """This machine in a few words: its host name, cores and platform."""
    from ...gpu.pinning import usable_cores

    return f"{platform.node()} ({usable_cores()} cores, {platform.platform(terse=True)})"


__all__ = [
    "CRASHED", "DETECTED", "ERROR", "EQUIVALENT", "KILLED", "NOT_RUN", "Result", "SURVIVED",
    "SURVIVES", "TIMED_OUT", "Verdict", "json_report", "machine", "text_report",
]
