"""Every saved failure case, replayed against the selected target and device.

One test per file: the cases kept with the package (``regressions/``, see
its README) and those of every folder ``--c128a-cases DIR`` adds. A case
that still fails fails its test with the invariant's diff and the ``c128a
replay`` line that reruns it; a malformed file, or one this installation
cannot replay, fails its own test as a fault of the case (never an expected
failure, never a skip), and the other cases still run
(:mod:`c128a.conformance.regression_cases`).
"""

from __future__ import annotations

import pytest

from c128a import cases
from c128a.conformance import KEPT_CASES, case_files, case_folders
from c128a.conformance.regression_cases import check_case


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
    check_case(path, c128a_target, c128a_device, c128a_padding_rows_override)
