"""What a check may need that a machine lacks: a device or a tool.

A check skipped because one of :data:`MISSING_DEVICE_OR_TOOL` is missing
did not run for a reason the run can stand (it is counted and shown). Any
other skip is a check that did not run on its target: the run fails unless
the user allows it (``--c128a-allow-not-run``, :mod:`c128a.plugin.verdicts`).
The reason says which: ``needs CUDA: ...`` or ``needs compute-sanitizer: ...``.
"""

from __future__ import annotations

MISSING_DEVICE_OR_TOOL = ("CUDA", "compute-sanitizer")


def needs(requirement: str, detail: str) -> str:
    """The skip reason of a check that needs ``requirement``, missing here."""
    if requirement not in MISSING_DEVICE_OR_TOOL:
        raise ValueError(
            f"requirement={requirement!r} is not a device or tool a check may lack; use one of "
            f"{', '.join(MISSING_DEVICE_OR_TOOL)} (any other skip is a check that did not run)"
        )
    return f"needs {requirement}: {detail}"


def missing_requirement(reason: str) -> str | None:
    """The device or tool a skip ``reason`` says is missing (None: another reason)."""
    for requirement in MISSING_DEVICE_OR_TOOL:
        if reason.startswith(f"needs {requirement}: "):
            return requirement
    return None
