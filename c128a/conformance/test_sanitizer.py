"""The selected target under NVIDIA's compute-sanitizer (CUDA only):
``memcheck`` finds no access outside an allocation, ``initcheck`` no read of
memory nothing wrote (a block-table entry the contract does not let a build
read), over the contract's historical steps and drawn ones, each at its
width and at full width (:func:`c128a.gpu.compute_sanitizer.run_sanitizer`, the
same child ``c128a sanitize`` runs). Skips where ``compute-sanitizer`` is
not found (``$C128A_COMPUTE_SANITIZER`` names it): a missing tool, which
the run can stand (:mod:`c128a.conformance.requirements`).
"""

from __future__ import annotations

import pytest

from c128a.conformance.requirements import skip_for_want_of
from c128a.failures import HarnessError
from c128a.gpu import compute_sanitizer

EXAMPLES = 10  # drawn steps besides the historical ones, seed 0: the same every run


def _sanitizer_missing() -> str | None:
    """Why compute-sanitizer cannot run here (None: it can)."""
    try:
        compute_sanitizer.find_sanitizer()
    except compute_sanitizer.SanitizerUnavailable as exc:
        return str(exc)
    return None


# One tool per test: each is a child process under the tool, and side by
# side they take the time of the longest.
@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.parametrize("tool", [
    pytest.param(tool, marks=pytest.mark.conformance(compute_sanitizer.PROPERTY_PREFIX + tool))
    for tool in compute_sanitizer.TOOLS
])
def test_target_is_clean_under_the_sanitizer(tool, c128a_target, c128a_padding_rows_override):
    missing = _sanitizer_missing()
    if missing is not None:
        skip_for_want_of("compute-sanitizer", missing)
    run = compute_sanitizer.run_sanitizer(
        tool, c128a_target.spec, padding_rows=c128a_padding_rows_override,
        examples=EXAMPLES, historical=True,
    )
    if run.errors:  # the child or the tool failed: no verdict on the target
        raise HarnessError("\n".join(run.errors))
    assert not run.findings, (
        f"{tool}: {len(run.findings)} finding(s) on {c128a_target.spec}; the first:\n"
        f"{run.findings[0].report}\n"
        f"rerun: c128a sanitize --target {c128a_target.spec} --tool {tool} --examples {EXAMPLES}"
    )
