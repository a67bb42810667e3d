"""Every saved failure case, replayed against the selected target and device.

One test per file: the cases kept with the package (``regressions/``, see
its README) and those of every folder ``--c128a-cases DIR`` adds. A case
that still fails fails its test with the invariant's diff and the ``c128a
replay`` line that reruns it; a malformed file fails its own test, naming
the file and the field, and the other cases still run.
"""

from __future__ import annotations

import pytest

from c128a.conformance import KEPT_CASES, case_files, case_folders
from c128a.runners import cases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "path" not in metafunc.fixturenames:
        return
    config = metafunc.config
    folders = case_folders(config.getoption("c128a_cases"), config.invocation_params.dir)
    metafunc.parametrize("path", [
        pytest.param(path, id=test_id, marks=pytest.mark.conformance(path.name))
        for test_id, path in case_files(folders)
    ])


def test_the_kept_cases_shipped_with_the_package():
    # An empty folder (package data left out of an install) would make the
    # replay of the kept cases vacuous.
    assert cases.case_files(KEPT_CASES), f"no *.json case in {KEPT_CASES}"


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
            f"case file: {path}\n"
            f"rerun: c128a replay {path} --target {c128a_target.spec}",
            pytrace=False,
        )
