"""Every saved failure case, replayed against the selected target and device.

One test per file in ``tests/regressions/``: a case that still fails fails
its test with the invariant's diff; a malformed file fails its own test,
naming the file and the field, and the other cases still run. See
``tests/regressions/README.md``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from c128a.runners import cases

REGRESSIONS = Path(__file__).parent / "regressions"
CASE_FILES = cases.case_files(REGRESSIONS)


def test_the_regression_folder_holds_cases():
    # An empty folder would make the replay below vacuous.
    assert CASE_FILES, f"no *.json case in {REGRESSIONS}"


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.name for p in CASE_FILES])
def test_saved_case_passes(path, c128a_target, c128a_device, c128a_padding_rows_override):
    try:
        case = cases.load_case(path)
        # The variant the case recorded, unless --c128a-padding-rows names one.
        outcome = cases.replay_case(
            case, c128a_target, c128a_device, padding_rows=c128a_padding_rows_override
        )
    except cases.CaseError as exc:
        pytest.fail(f"malformed case: {exc}", pytrace=False)
    if not outcome.replayable:
        pytest.skip(f"{path.name}: {outcome.report.splitlines()[0]}")
    if not outcome.passed:
        pytest.fail(
            f"{path.name}: {case.property} ({case.kind}, found on {case.target}) still fails "
            f"on {c128a_target.spec}:\n{outcome.report}\n"
            f"rerun: c128a replay {path} --target {c128a_target.spec}",
            pytrace=False,
        )
