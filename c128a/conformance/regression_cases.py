"""A regression case file as a check of the target: its verdict, or why it
cannot give one.

A case that still fails is the target's failure (a known-failures file may
expect it). A case that cannot be checked is never that: a malformed or
truncated file, or one this installation cannot replay (no concrete inputs
and a blob its Hypothesis refuses), fails its test as an
:class:`UncheckableCase`, naming the file once and why; no known-failures
line turns it into an expected failure, and it never skips. Only a case
that needs a device or tool missing here (a sanitizer case: CUDA and
``compute-sanitizer``) skips, with the reason
(:mod:`c128a.conformance.requirements`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from c128a import cases
from c128a.conformance.requirements import skip_for_want_of
from c128a.failures import UsageError
from c128a.gpu import compute_sanitizer


class UncheckableCase(pytest.fail.Exception, UsageError):
    """A case file that gives no verdict on the target. Shown as
    ``pytest.fail(..., pytrace=False)`` shows its message (no traceback, no
    chained errors), and a :class:`~c128a.failures.UsageError`: a fault of
    the case, never the target's failure."""

    def __init__(self, message: str):
        super().__init__(message, pytrace=False)


def skip_if_missing_device_or_tool(case: cases.Case, device) -> None:
    """A sanitizer case replays on a GPU, under compute-sanitizer."""
    if case.property not in compute_sanitizer.PROPERTIES:
        return
    if device.type != "cuda":
        skip_for_want_of("CUDA", f"a {case.property} case replays on a GPU only (device {device})")
    try:
        compute_sanitizer.find_sanitizer()
    except compute_sanitizer.SanitizerUnavailable as exc:
        skip_for_want_of("compute-sanitizer", str(exc))


def check_case(path: Path, target, device, padding_rows: str | None) -> None:
    """Replay the case at ``path`` on ``target``: passes, fails with the
    diff and the line that reruns it, or raises :class:`UncheckableCase`."""
    try:
        case = cases.load_case(path)
        skip_if_missing_device_or_tool(case, device)
        # The variant the case recorded, unless --c128a-padding-rows names one.
        outcome = cases.replay_case(case, target, device, padding_rows=padding_rows)
    except cases.CaseError as exc:
        raise UncheckableCase(f"malformed case, no verdict on the target: {exc}") from None
    if not outcome.replayable:
        raise UncheckableCase(
            f"case {path} cannot be replayed here, so it gives no verdict on the target: "
            f"{outcome.report}\nRecord it again (c128a fuzz) or remove it from its folder."
        )
    if not outcome.passed:
        pytest.fail(
            f"{path.name}: {case.property} ({case.kind}, found on {case.target}) still fails "
            f"on {target.spec}:\n{outcome.report}\n"
            f"case file: {path}\n"
            f"rerun: c128a replay {path} --target {target.spec}",
            pytrace=False,
        )
