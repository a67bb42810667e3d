"""Which commit broke a check: ``git bisect``'s search over a vLLM checkout.

The revisions searched are git's: those that are ancestors of the bad
revision and not of any good one (``git rev-list BAD ^GOOD``). Each step
tests the candidate that splits them most evenly (counted by ancestry, as
git counts, so merges are handled too): bad keeps its ancestors, good
removes them. A revision that cannot be judged (its target does not load,
its step crashed or hung: :mod:`c128a.runners.revisions`) is skipped, as
``git bisect skip`` does: the search goes on around it, and when only
skipped revisions are left between a good one and the first known bad one,
the first bad commit is one of them, and all are named.

Everything is read from git's objects (``git rev-list``, ``git rev-parse``):
the checkout's work tree and its own bisect state are never touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..failures import UsageError
from ..targets.vllm_source import git
from . import revisions

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    parents: tuple[str, ...]

    @property
    def short(self) -> str:
        return self.sha[:12]

    def __str__(self) -> str:
        return f'{self.short} "{self.subject}"'


@dataclass
class Search:
    """The state of one bisection: the commits that may still be the first
    bad one (``candidates``, the current bad among them), and those skipped."""

    commits: dict[str, Commit]
    order: list[str]
    """Newest first (``git rev-list``'s order): ties go to the newer."""
    bad: str
    candidates: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)

    def __post_init__(self):
        if not self.candidates:
            self.candidates = set(self.order)

    def ancestors(self, sha: str) -> set[str]:
        """``sha`` and its ancestors among the candidates."""
        seen, pending = set(), [sha]
        while pending:
            current = pending.pop()
            if current in seen or current not in self.candidates:
                continue
            seen.add(current)
            pending.extend(self.commits[current].parents)
        return seen

    def next(self) -> str | None:
        """The candidate to test next: the one whose ancestors among the
        candidates come nearest to half of them; None when only the current
        bad and skipped ones are left."""
        testable = [c for c in self.order
                    if c in self.candidates and c != self.bad and c not in self.skipped]
        if not testable:
            return None
        total = len(self.candidates)

        def balance(sha: str) -> int:
            below = len(self.ancestors(sha))
            return min(below, total - below)

        return max(testable, key=balance)  # max keeps the first (newest) of equals

    def mark(self, sha: str, verdict: str) -> None:
        if verdict == BAD:
            self.candidates = self.ancestors(sha)
            self.bad = sha
        elif verdict == GOOD:
            self.candidates -= self.ancestors(sha)
        else:
            self.skipped.add(sha)

    @property
    def done(self) -> bool:
        return self.candidates == {self.bad}

    def left(self) -> int:
        """Candidates still to test (not the current bad, not skipped)."""
        return len(self.candidates - {self.bad} - self.skipped)

    def steps_left(self) -> int:
        """About how many more steps, were none skipped."""
        return math.ceil(math.log2(self.left() + 1)) if self.left() else 0

    def could_be(self) -> list[Commit]:
        """The first bad commit's possibilities when the search ends on
        skipped revisions: the current bad and the skipped candidates,
        oldest first."""
        left = self.candidates & ({self.bad} | self.skipped)
        return [self.commits[c] for c in reversed(self.order) if c in left]


def commit_of(checkout, revision: str, what: str) -> str:
    """The full hash ``revision`` names in ``checkout``; a usage error naming
    ``what`` (``--good``, ``--bad``) when it names none."""
    spec = f"{what} {revision}"
    found = git(checkout, "rev-parse", "--verify", "--quiet", "--end-of-options",
                f"{revision}^{{commit}}", spec=spec, check=False)
    if found.returncode != 0:
        raise UsageError(f"{what} {revision!r}: {checkout} has no such commit")
    return found.stdout.decode().strip()


def search_between(checkout, good: list[str], bad: str) -> Search:
    """The search from ``good`` (full hashes) to ``bad``: a usage error when
    a good revision is not an ancestor of the bad one, or nothing lies
    between them."""
    for sha in good:
        ancestor = git(checkout, "merge-base", "--is-ancestor", sha, bad, spec="--good",
                       check=False)
        if ancestor.returncode != 0:
            raise UsageError(
                f"--good {sha[:12]} is not an ancestor of --bad {bad[:12]}: bisect searches the "
                "history between them; name an older good revision"
            )
    listed = git(checkout, "rev-list", "--topo-order", "--parents", "--format=%s", bad,
                 *(f"^{sha}" for sha in good), spec="rev-list").stdout.decode("utf-8", "replace")
    commits: dict[str, Commit] = {}
    order: list[str] = []
    lines = listed.splitlines()
    for header, subject in zip(lines[0::2], lines[1::2]):
        shas = header.removeprefix("commit ").split()
        commits[shas[0]] = Commit(shas[0], subject.strip(), tuple(shas[1:]))
        order.append(shas[0])
    if bad not in commits:
        raise UsageError(f"--bad {bad[:12]} is itself a good revision: nothing to bisect")
    return Search(commits, order, bad)


# ---------------------------------------------------------------- the bisection


@dataclass(frozen=True)
class Outcome:
    """How a bisection ended: the first bad commit (or, where skipped
    revisions hide it, those it could be), the checks bisected, the shrunk
    failing example at the first bad commit and its case, and how the case
    replays there and at each parent."""

    first_bad: Commit | None
    could_be: tuple[Commit, ...]
    checks: tuple[str, ...]
    failure: object = None  # revisions.CheckOutcome at the first bad commit
    replays: tuple[tuple[Commit, object], ...] = ()  # (commit, revisions.RevisionResult)
    steps: int = 0


def bisect(checkout, good: list[str], bad: str, checks: tuple[str, ...], *, device: str,
           max_examples: int, time_limit: float, cases_dir, say) -> Outcome:
    """Find the first commit between ``good`` and ``bad`` (full hashes) at
    which one of ``checks`` fails, each revision checked in a child process
    (:func:`~c128a.runners.revisions.check_revision`); ``say(line)`` prints
    progress. The checks bisected are those of ``checks`` that fail at the
    bad revision; every one of them must pass at the good ones. A bad or
    good revision that cannot be judged, a bad one that fails nothing or a
    good one that fails, is a :class:`~c128a.failures.UsageError`."""
    search = search_between(checkout, good, bad)

    def request(commit: str, names, **options):
        return revisions.Request(str(checkout), commit, tuple(names), device=device,
                                 max_examples=max_examples, **options)

    say(f"bisecting {len(search.order)} revision(s) of {checkout} between good "
        f"{', '.join(sha[:12] for sha in good)} and bad {search.commits[bad]}; checks: "
        f"{', '.join(checks)}; {max_examples} example(s) each, {time_limit:g} s a step")
    at_bad = revisions.check_revision(request(bad, checks, stop_at_first_failure=False),
                                      time_limit)
    _must_judge(at_bad, f"--bad {search.commits[bad]}")
    failing = tuple(name for name in checks if name in at_bad.failed)
    if not failing:
        raise UsageError(f"--bad {search.commits[bad]} passes {', '.join(checks)}: nothing to "
                         "bisect (more examples, --max-examples, may find its failure)")
    say(f"bad  {search.commits[bad]}: fails {', '.join(failing)} [{at_bad.seconds:.1f} s]; "
        f"widths: {at_bad.widths}")
    for sha in good:
        known = Commit(sha, _subject(checkout, sha), ())
        at_good = revisions.check_revision(request(sha, failing), time_limit)
        _must_judge(at_good, f"--good {known}", failing)
        if at_good.failed:
            raise UsageError(f"--good {known} fails {', '.join(at_good.failed)} too: not a "
                             "good revision for these checks; name an older one, or select "
                             "the checks that regressed with -k")
        say(f"good {known}: passes {', '.join(failing)} [{at_good.seconds:.1f} s]")
    steps = 0
    while not search.done:
        sha = search.next()
        if sha is None:
            break
        steps += 1
        commit = search.commits[sha]
        result = revisions.check_revision(request(sha, failing), time_limit)
        verdict, detail = judged(result, failing)
        search.mark(sha, verdict)
        say(f"step {steps}: {commit}: {detail} [{result.seconds:.1f} s]; {search.left()} "
            f"revision(s) left to test, about {search.steps_left()} step(s)")
    if not search.done:
        return Outcome(None, tuple(search.could_be()), failing, steps=steps)
    first = search.commits[search.bad]
    shrunk = revisions.check_revision(
        request(first.sha, failing, shrink=True, cases_dir=str(cases_dir)), time_limit)
    failure = shrunk.first_failure() if shrunk.status == revisions.CHECKED else None
    replays = []
    if failure is not None and failure.case is not None:
        for sha in (first.sha, *first.parents):
            parent = search.commits.get(sha) or Commit(sha, _subject(checkout, sha), ())
            replays.append((parent, revisions.replay_at(checkout, sha, failure.case, device,
                                                        time_limit)))
    return Outcome(first, (), failing, failure or shrunk, tuple(replays), steps)


def judged(result, checks) -> tuple[str, str]:
    """(good, bad or skip, the step's words) of a revision's result: bad
    where a check failed; skipped where it did not load, crashed or hung,
    or where a check could not judge it (the suite's own error, or a check
    that does not apply to this revision's target); else good."""
    if result.status != revisions.CHECKED:
        return SKIP, f"skipped: {result.status}: {result.reason}"
    if result.failed:
        return BAD, f"bad: fails {', '.join(result.failed)}"
    unjudged = [f"{o.name} ({o.verdict}: {o.message.splitlines()[0] if o.message else ''})"
                for o in result.outcomes if o.verdict in (revisions.ERROR,
                                                          revisions.NOT_APPLICABLE)]
    if unjudged:
        return SKIP, f"skipped: cannot be judged by {'; '.join(unjudged)}"
    return GOOD, f"good: passes {', '.join(checks)}"


def _must_judge(result, what: str, checks=()) -> None:
    """A usage error unless ``result`` judges the revision on ``checks``
    (the bad revision: only that it loaded and ran)."""
    verdict, detail = judged(result, checks)
    if verdict == SKIP and (checks or result.status != revisions.CHECKED):
        raise UsageError(f"{what} cannot be judged: {detail.removeprefix('skipped: ')}")


def _subject(checkout, sha: str) -> str:
    done = git(checkout, "log", "-1", "--format=%s", sha, spec="log", check=False)
    return done.stdout.decode("utf-8", "replace").strip()
