"""Checking one revision of a vLLM checkout, in a process of its own.

``c128a bisect`` and ``c128a history`` check a revision by running the
property suite (:data:`c128a.checks.PROPERTIES`, the checks of the
conformance suite's ``test_properties.py``) against the target
``vllm-source:CHECKOUT@COMMIT``, under the ``ci`` profile (derandomized:
every revision is tried on the same examples) with a chosen example count.
Each check in its own child process (:func:`check_revision`), forked from a
server that has imported torch and Hypothesis once and run nothing
(``multiprocessing``'s ``forkserver``), so a step costs its checks, not
an interpreter's start-up: a revision that crashes the process (a
segfault, ``os._exit``) or runs past the time limit ends only its child,
and comes back as such (:data:`CRASHED`, :data:`HUNG`), never as a verdict
of the checks. A revision whose target does not load is :data:`UNLOADABLE`,
with the loader's one line.

A failing check's example is saved as a case (:mod:`c128a.cases`)
when asked (its shrunk example, with ``shrink``); a saved case is replayed
against a revision the same way (:func:`replay_at`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import Phase, Verbosity, settings

from .. import cases
from ..checks import PROPERTIES
from ..checks.profiles import CI_PROFILE, register_profiles
from ..failures import ContractViolation, UsageError, failure_text, is_kill, one_line
from ..step import Batch
from ..targets import load_target, use_device
from ..targets.device import INTERPRET_ENV, KERNELS_PACKAGE
from ..targets.target import widths_of
from ..targets.vllm_source import source_spec

CHECKED, UNLOADABLE, CRASHED, HUNG = "checked", "does not load", "crashed", "hung"
PASSED, FAILED, ERROR, NOT_APPLICABLE = "passed", "failed", "error", "not applicable"
DEFAULT_STEP_TIMEOUT_S = 600.0
DEFAULT_MAX_EXAMPLES = 25
"""The ``ci`` profile's example count."""


@dataclass(frozen=True)
class CheckOutcome:
    """One check at one revision; for a failure, its example and saved case."""

    name: str
    verdict: str
    message: str = ""
    example: str = ""
    case: str | None = None


@dataclass(frozen=True)
class RevisionResult:
    """What checking one revision gave: ``status`` (:data:`CHECKED`, or why
    not: :data:`UNLOADABLE`, :data:`CRASHED`, :data:`HUNG`, with ``reason``),
    each check's outcome, the widths the checks drew W from, and the
    consumers the revision lacks."""

    commit: str
    status: str
    reason: str = ""
    outcomes: tuple[CheckOutcome, ...] = ()
    widths: str = ""
    consumer_gaps: tuple[str, ...] = ()
    seconds: float = 0.0

    def named(self, verdict: str) -> list[str]:
        return [o.name for o in self.outcomes if o.verdict == verdict]

    @property
    def failed(self) -> list[str]:
        return self.named(FAILED)

    def first_failure(self) -> CheckOutcome | None:
        return next((o for o in self.outcomes if o.verdict == FAILED), None)


@dataclass(frozen=True)
class Request:
    """What a child checks: ``checks`` (property names, in order) at
    ``commit`` of ``checkout``; stopping at the first failure or not;
    shrinking the failure and saving it in ``cases_dir`` or not; or, with
    ``replay``, that case file alone. ``environment`` is the parent's at the
    request (the server's was taken when it started)."""

    checkout: str
    commit: str
    checks: tuple[str, ...] = ()
    device: str = "cpu"
    max_examples: int = DEFAULT_MAX_EXAMPLES
    stop_at_first_failure: bool = True
    shrink: bool = False
    cases_dir: str | None = None
    replay: str | None = None
    environment: dict[str, str] = field(default_factory=lambda: dict(os.environ))


# ---------------------------------------------------------------- which checks


def select_checks(expression: str | None) -> tuple[str, ...]:
    """The property names ``-k EXPRESSION`` selects, in the suite's order:
    pytest's keyword expressions (words matched case-insensitively as
    substrings of the name; ``and``, ``or``, ``not``, parentheses); all of
    them without one. A bad expression, or one selecting nothing, is a
    :class:`~c128a.failures.UsageError`."""
    if expression is None or not expression.strip():
        return tuple(PROPERTIES)
    matches = keyword_matcher(expression)
    chosen = tuple(name for name in PROPERTIES if matches(name))
    if not chosen:
        raise UsageError(f"-k {expression!r} selects no check; the checks: {', '.join(PROPERTIES)}")
    return chosen


_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def keyword_matcher(expression: str) -> Callable[[str], bool]:
    """``expression`` (pytest's ``-k`` grammar) as a predicate on a name."""
    tokens = _TOKEN.findall(expression)
    position = 0

    def fail(why: str):
        raise UsageError(f"-k {expression!r}: {why}; write e.g. -k 'views or matches_oracle'")

    def peek():
        return tokens[position] if position < len(tokens) else None

    def take():
        nonlocal position
        position += 1
        return tokens[position - 1]

    def either():
        left = both()
        while peek() == "or":
            take()
            right = both()
            left = (lambda a, b: lambda n: a(n) or b(n))(left, right)
        return left

    def both():
        left = negated()
        while peek() == "and":
            take()
            right = negated()
            left = (lambda a, b: lambda n: a(n) and b(n))(left, right)
        return left

    def negated():
        if peek() == "not":
            take()
            inner = negated()
            return lambda n: not inner(n)
        return atom()

    def atom():
        token = peek()
        if token is None:
            fail("it ends where a word or '(' was expected")
        take()
        if token == "(":
            inner = either()
            if peek() != ")":
                fail("a '(' is not closed")
            take()
            return inner
        if token in (")", "and", "or"):
            fail(f"{token!r} where a word was expected")
        word = token.lower()
        return lambda n: word in n.lower()

    matcher = either()
    if peek() is not None:
        fail(f"unexpected {peek()!r}")
    return matcher


# ---------------------------------------------------------------- in the child


def _settings(max_examples: int, shrink: bool):
    register_profiles()
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(settings.get_profile(CI_PROFILE), max_examples=max_examples, phases=phases,
                    report_multiple_bugs=False, verbosity=Verbosity.quiet)


def _run(request: Request) -> RevisionResult:
    os.environ.clear()
    os.environ.update(request.environment)
    started = time.monotonic()
    device = use_device(request.device)
    spec = source_spec(request.checkout, request.commit)
    try:
        target = load_target(spec)
    except UsageError as exc:
        return RevisionResult(request.commit, UNLOADABLE, one_line(exc).partition(": ")[2],
                              seconds=time.monotonic() - started)
    if request.replay is not None:
        outcomes = (_replayed(target, request.replay, device),)
    else:
        outcomes = []
        for name in request.checks:
            outcomes.append(_checked(name, target, device, request))
            if outcomes[-1].verdict == FAILED and request.stop_at_first_failure:
                break
        outcomes = tuple(outcomes)
    gaps = tuple(f"{name}: {why}" for name, why in target.consumer_gaps)
    return RevisionResult(request.commit, CHECKED, outcomes=outcomes,
                          widths=widths_of(target),
                          consumer_gaps=gaps, seconds=time.monotonic() - started)


def _checked(name: str, target, device, request: Request) -> CheckOutcome:
    import torch

    prop = PROPERTIES[name]
    reason = prop.unsupported(target)
    if reason is not None:
        return CheckOutcome(name, NOT_APPLICABLE, reason)
    raised: dict[int, Batch] = {}

    def remember(batch: Batch, run) -> None:
        try:
            run()
        except ContractViolation as exc:
            raised[id(exc)] = batch
            raise

    test = prop.test(target, torch.device(device),
                     settings=_settings(request.max_examples, request.shrink), around=remember)
    try:
        test()
    except Exception as exc:  # noqa: BLE001 - a verdict either way
        if not is_kill(exc):
            return CheckOutcome(name, ERROR, one_line(exc))
        batch = next((raised[id(e)] for e in [exc, *getattr(exc, "exceptions", ())]
                      if id(e) in raised), None)
        message = failure_text(exc)
        saved = None
        if batch is not None and request.cases_dir is not None:
            case = cases.new_case(
                property=name, target=target.spec, kind="failure", failure=message,
                batch=batch, device=device, padding_rows=target.padding_rows,
                outside_contract=cases.contract_breach(batch, target.padding_rows))
            saved = str(cases.write_case(case, request.cases_dir)[0])
        example = cases.describe_batch(batch) if batch is not None else ""
        return CheckOutcome(name, FAILED, message, example, saved)
    return CheckOutcome(name, PASSED)


def _replayed(target, path: str, device) -> CheckOutcome:
    case = cases.load_case(path)
    outcome = cases.replay_case(case, target, device)
    verdict = {cases.PASSES: PASSED, cases.FAILS: FAILED}.get(outcome.verdict, ERROR)
    return CheckOutcome(case.property, verdict, outcome.report, case=path)


def _watch(lifeline) -> None:
    """End this child when the process that asked for it ends, however it
    ends (a step outlives no command): the only writer of ``lifeline`` is
    that process, so its end reads as EOF here."""
    def watch():
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="c128a-lifeline", daemon=True).start()


def _child(request: Request, send, lifeline) -> None:
    _watch(lifeline)
    try:
        result = _run(request)
    except BaseException as exc:  # noqa: BLE001 - whatever ends the step is its verdict
        result = RevisionResult(request.commit, CRASHED, f"the step raised {one_line(exc)}")
    send.send(result)
    send.close()


# ---------------------------------------------------------------- in the parent


_CONTEXT = None
KERNELS = "c128a.kernels.vllm_extracts"


def _context():
    """The forkserver context, its server preloading this module (torch,
    Hypothesis, the checks: imported once, nothing run), and the kernels
    where this process has chosen its device (Triton's interpreter is
    switched on or off before they are imported, and the server starts
    with this process's environment)."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        chosen = INTERPRET_ENV in os.environ or KERNELS_PACKAGE in sys.modules
        _CONTEXT.set_forkserver_preload([__name__, *([KERNELS] if chosen else [])])
    return _CONTEXT


@contextlib.contextmanager
def _main_module_left_behind():
    """While a child starts: the parent's ``__main__`` as an interactive
    session's (no file, no spec), so that the child, which needs nothing of
    it, does not run the parent's script again (multiprocessing reruns a
    main module with a file in every child it starts)."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def check_revision(request: Request, time_limit: float = DEFAULT_STEP_TIMEOUT_S) -> RevisionResult:
    """Run ``request`` in a child process and wait for it, at most
    ``time_limit`` seconds (then it is killed: :data:`HUNG`). A child that
    dies without a verdict is :data:`CRASHED`, naming its signal or status."""
    context = _context()
    receive, send = context.Pipe(duplex=False)
    lifeline, keep_alive = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(request, send, lifeline), daemon=True)
    started = time.monotonic()
    result = None
    try:
        with _main_module_left_behind():
            child.start()
        send.close()
        lifeline.close()
        if receive.poll(time_limit):
            try:
                result = receive.recv()
            except (EOFError, OSError):
                result = None
        child.join(timeout=5.0 if result is not None else 0.5)
        if result is None and child.is_alive():
            child.kill()
            child.join()
            return RevisionResult(request.commit, HUNG, f"ran past the step's limit of "
                                  f"{time_limit:g} s and was killed",
                                  seconds=time.monotonic() - started)
    finally:
        keep_alive.close()  # a child started but not known here ends too
        if child.pid is not None and child.is_alive():
            child.kill()
            child.join()
        receive.close()
    if result is not None:
        return result
    code = child.exitcode
    if code is not None and code < 0:
        try:
            why = f"died of {signal.Signals(-code).name}"
        except ValueError:
            why = f"died of signal {-code}"
    else:
        why = f"exited with status {code} without a verdict"
    return RevisionResult(request.commit, CRASHED, why, seconds=time.monotonic() - started)


def replay_at(checkout, commit: str, case_path: Path | str, device: str,
              time_limit: float = DEFAULT_STEP_TIMEOUT_S) -> RevisionResult:
    """Replay the case at ``case_path`` against ``commit`` of ``checkout``, in a child."""
    return check_revision(Request(str(checkout), commit, device=device, replay=str(case_path)),
                          time_limit)
