"""``c128a bisect``: the first commit of a vLLM checkout at which a check fails.

``c128a bisect --checkout PATH --good REV --bad REV [-k EXPR]`` searches the
revisions between them as ``git bisect`` does (:mod:`c128a.runners.bisection`),
each checked in a child process of its own with a time limit
(:mod:`c128a.runners.revisions`): the checks are those of the property suite
that fail at the bad revision (``-k`` narrows them first, as pytest's does);
a revision whose target does not load, or whose step crashes or hangs, is
skipped and named. It prints a line per step, then the first bad commit,
its subject, and the shrunk failing example there, saved as a case that
``c128a replay CASE --target vllm-source:PATH@COMMIT`` replays (it is
replayed there and at each parent first, and the verdicts printed).
Nothing of the checkout is written: every revision is read from git.

Exit status: 0 when the first bad commit is named, 1 when skipped
revisions hide it (each one it could be is named), 2 for a usage error (a
revision the checkout lacks, a good revision that fails the checks or a
bad one that passes them, either one not loading), 130 or 143 after SIGINT or
SIGTERM (the revision being checked is stopped with its child process).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from pathlib import Path

from .. import options
from ..failures import EXIT_FAILED, EXIT_OK, UsageError
from ..interrupts import HeldSignals
from ..options import add_to_argparse
from ..runners.bisection import bisect, commit_of
from ..runners.revisions import (
    CHECKED,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_STEP_TIMEOUT_S,
    FAILED,
    PASSED,
    select_checks,
)
from ..targets.vllm_source import git, source_spec
from .common import add_device_argument, choose_device


def add_revision_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``bisect`` and ``history`` share."""
    parser.add_argument("--checkout", required=True, type=Path, metavar="PATH",
                        help="a git checkout of vLLM (read with git; its work tree is not touched)")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="only the checks (property names) this pytest-style keyword "
                        "expression selects, e.g. 'views or matches_oracle'")
    parser.add_argument("--max-examples", type=int, default=DEFAULT_MAX_EXAMPLES, metavar="N",
                        help=f"generated examples per check at each revision, after the "
                        f"explicit ones (default {DEFAULT_MAX_EXAMPLES}, the ci profile's)")
    parser.add_argument("--step-timeout", type=float, default=DEFAULT_STEP_TIMEOUT_S,
                        metavar="S", help="seconds a revision's child process may run before it "
                        f"is killed and the revision skipped (default {DEFAULT_STEP_TIMEOUT_S:g})")
    add_device_argument(parser)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--good", action="append", required=True, metavar="REV",
                        help="a revision where the checks pass (repeatable)")
    parser.add_argument("--bad", required=True, metavar="REV",
                        help="a revision where they fail")
    add_revision_arguments(parser)
    add_to_argparse(parser, options.CASES_DIR_OPTION)


def checked_options(args: argparse.Namespace) -> Path:
    """The checkout, made absolute; a usage error for a bad count or limit."""
    if args.max_examples < 1:
        raise UsageError(f"--max-examples={args.max_examples} must be >= 1")
    if not (args.step_timeout > 0 and math.isfinite(args.step_timeout)):
        raise UsageError(f"--step-timeout={args.step_timeout} must be a finite number of "
                         f"seconds > 0; the default is {DEFAULT_STEP_TIMEOUT_S:g}")
    checkout = args.checkout.expanduser().resolve()
    if not checkout.is_dir():
        raise UsageError(f"--checkout {args.checkout}: no such folder")
    inside = git(checkout, "rev-parse", "--git-dir", spec="--checkout", check=False)
    if inside.returncode != 0:
        said = " ".join(inside.stderr.decode("utf-8", "replace").split())
        raise UsageError(f"--checkout {args.checkout} is not a git checkout ({said}); point it "
                         "at a clone of vLLM")
    return checkout


def say(line: str) -> None:
    print(line, flush=True)


class Interrupted(BaseException):
    """SIGINT or SIGTERM during a run: the step running is killed on the
    way out (:func:`~c128a.runners.revisions.check_revision` kills its
    child), and nothing more runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame=None) -> None:
    raise Interrupted(signum)


def interruptible(command: str, run) -> int:
    """``run()``'s status; after SIGINT or SIGTERM one line and 128 + the signal."""
    held = HeldSignals(_interrupt, (signal.SIGINT, signal.SIGTERM))
    try:
        return run()
    except Interrupted as stop:
        name = signal.Signals(stop.signum).name
        print(f"c128a {command}: interrupted by {name}; the revision being checked was "
              "stopped, nothing more runs", file=sys.stderr, flush=True)
        return 128 + stop.signum
    finally:
        held.restore()


def run(args: argparse.Namespace) -> int:
    return interruptible("bisect", lambda: bisect_command(args))


def bisect_command(args: argparse.Namespace) -> int:
    checkout = checked_options(args)
    device = choose_device(args.device)
    checks = select_checks(args.keyword)
    good = [commit_of(checkout, revision, "--good") for revision in args.good]
    bad = commit_of(checkout, args.bad, "--bad")
    outcome = bisect(checkout, good, bad, checks, device=device, max_examples=args.max_examples,
                     time_limit=args.step_timeout, cases_dir=Path(args.cases_dir), say=say)
    if outcome.first_bad is None:
        say("the first bad commit cannot be named: only skipped revisions are left; it is "
            "one of:")
        for commit in outcome.could_be:
            say(f"  {commit.sha} {commit.subject}")
        return EXIT_FAILED
    first = outcome.first_bad
    say(f"first bad commit: {first.sha} {first.subject}")
    failure = outcome.failure
    if getattr(failure, "verdict", None) != FAILED:
        # The shrinking run did not fail again (a flaky revision?): said, not hidden.
        status = getattr(failure, "status", None)
        why = (f"{status}: {failure.reason}" if status not in (None, CHECKED)
               else "it passed this time")
        say(f"  no failing example saved: the shrinking run at {first.short} did not fail "
            f"({why})")
        return EXIT_FAILED
    say(f"  check: {failure.name}; failing example (shrunk): {failure.example}")
    for line in failure.message.strip().splitlines()[:6]:
        say(f"    {line}")
    if failure.case is None:
        say("  no case saved (the failure has no single step)")
        return EXIT_OK
    say(f"  case: {failure.case}")
    for commit, result in outcome.replays:
        role = "the first bad commit" if commit.sha == first.sha else "its parent"
        if result.status != CHECKED:
            verdict = f"cannot replay ({result.status}: {result.reason})"
        else:
            replayed = result.outcomes[0]
            verdict = {FAILED: "fails", PASSED: "passes"}.get(
                replayed.verdict, f"cannot replay ({replayed.message.splitlines()[0]})")
        say(f"  replayed at {commit.short} ({role}): {verdict}")
    say(f"  rerun: c128a replay {failure.case} --target {source_spec(checkout, first.sha)}")
    return EXIT_OK
