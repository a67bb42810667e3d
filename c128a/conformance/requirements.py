"""What a check may need that a machine lacks: a device or a tool.

A check that the suite itself skips because one of
:data:`MISSING_DEVICE_OR_TOOL` is missing (:func:`skip_for_want_of`, which
raises :class:`MissingRequirement`) did not run for a reason the run can
stand (it is counted and shown). Any other skip is a check that did not run
on its target: the run fails unless the user allows it
(``--c128a-allow-not-run``, :mod:`c128a.plugin.verdicts`). Which is which
is told by the exception's class, never by the reason's words: a target's
own ``pytest.skip("needs CUDA: ...")`` excuses nothing. The reason reads
``needs CUDA: ...`` or ``needs compute-sanitizer: ...``.
"""

from __future__ import annotations

import pytest

MISSING_DEVICE_OR_TOOL = ("CUDA", "compute-sanitizer")


def needs(requirement: str, detail: str) -> str:
    """The skip reason of a check that needs ``requirement``, missing here."""
    if requirement not in MISSING_DEVICE_OR_TOOL:
        raise ValueError(
            f"requirement={requirement!r} is not a device or tool a check may lack; use one of "
            f"{', '.join(MISSING_DEVICE_OR_TOOL)} (any other skip is a check that did not run)"
        )
    return f"needs {requirement}: {detail}"


class MissingRequirement(pytest.skip.Exception):
    """The suite's own skip of a check that needs ``requirement`` (a device
    or tool of :data:`MISSING_DEVICE_OR_TOOL`), missing here."""

    def __init__(self, requirement: str, detail: str):
        self.requirement = requirement
        super().__init__(needs(requirement, detail))


# Shown as pytest shows its own outcomes, without the module's path
# ("MissingRequirement: needs CUDA: ..."), as pytest does for Skipped.
MissingRequirement.__module__ = "builtins"


def skip_for_want_of(requirement: str, detail: str):
    """Skip the running check: ``requirement`` is missing here (``detail``: why)."""
    __tracebackhide__ = True  # the skip's place is the caller's line, as pytest.skip's is
    raise MissingRequirement(requirement, detail)


def missing_requirement_of(excinfo: pytest.ExceptionInfo | None) -> str | None:
    """The device or tool the suite skipped a check for (None: any other
    outcome, a skip worded alike by anyone else included)."""
    if excinfo is None or not isinstance(excinfo.value, MissingRequirement):
        return None
    return excinfo.value.requirement
