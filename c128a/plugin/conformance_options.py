"""The options of a conformance run (``pytest --pyargs c128a.conformance``):
the folders of regression cases (``--c128a-cases``, besides the kept ones),
the known-failures file (``--c128a-known-failures``,
:mod:`c128a.plugin.known_failures`), ``--c128a-allow-not-run``
(:mod:`c128a.plugin.verdicts`, which also prints the run's verdict) and
``--c128a-check-timeout`` (:mod:`c128a.plugin.check_timeout`), with the
``conformance`` marker.

Registered by :mod:`c128a.plugin.pytest_plugin` (its ``pytest_plugins``), so
a kernel repository's rootdir, with no ini file of its own, gets them too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from c128a import options

CASES_OPTION = "--c128a-cases"
KNOWN_FAILURES_OPTION = "--c128a-known-failures"
CONFORMANCE_MARKER = (
    "conformance(name): a check of the selected target; NAME is the property or regression "
    "case it checks, the name a --c128a-known-failures file gives it"
)

_folders_key = pytest.StashKey[list]()
_timeout_key = pytest.StashKey[tuple]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("c128a")
    group.addoption(
        CASES_OPTION,
        metavar="DIR",
        action="append",
        default=[],
        dest="c128a_cases",
        help="also replay the regression cases (*.json) in DIR, besides the ones kept with "
        "the package; repeatable",
    )
    group.addoption(
        KNOWN_FAILURES_OPTION,
        metavar="FILE",
        default=None,
        dest="c128a_known_failures",
        help="expect the properties and cases FILE lists (one 'NAME: reason' a line) to fail: "
        "their failures are reported as xfailed, and a listed one that passes fails the run",
    )
    options.add_to_pytest(group, options.ALLOW_NOT_RUN_OPTION)
    options.add_to_pytest(group, options.CHECK_TIMEOUT_OPTION)


def case_folders_line(folders: list[tuple[str, Path]], counts: list[int]) -> str:
    """Header line: how many cases each folder holds."""
    parts = [f"{count} in {label or 'the package'}" for (label, _), count in zip(folders, counts)]
    return "c128a regression cases: " + ", ".join(parts)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", CONFORMANCE_MARKER)
    from c128a.failures import UsageError
    from c128a.plugin import verdicts

    try:
        allow_not_run = options.resolve_flag(
            options.ALLOW_NOT_RUN_OPTION, config.getoption("allow_not_run"), os.environ
        )
    except UsageError as exc:
        raise pytest.UsageError(f"c128a: {exc}") from None
    verdicts_plugin = verdicts.Verdicts(config, allow_not_run)
    config.pluginmanager.register(verdicts_plugin, verdicts.PLUGIN_NAME)
    from c128a.plugin import check_timeout

    seconds, origin = check_timeout.resolve_check_timeout(config)
    config.stash[_timeout_key] = (seconds, origin)
    config.pluginmanager.register(check_timeout.CheckTimeout(seconds, origin),
                                  check_timeout.PLUGIN_NAME)
    from c128a.conformance import case_folders
    from c128a.cases import case_files

    added = config.getoption("c128a_cases")
    if any(not name.strip() for name in added):
        raise pytest.UsageError(
            f"c128a: {CASES_OPTION}='' names no folder; name a folder of *.json cases "
            "(. for the folder pytest runs in)"
        )
    folders = case_folders(added, config.invocation_params.dir)
    for label, path in folders[1:]:
        if path.exists() and not path.is_dir():
            raise pytest.UsageError(
                f"c128a: {CASES_OPTION}={label}: {path} is not a folder; name the folder that "
                "holds the *.json cases"
            )
        if not path.is_dir():
            raise pytest.UsageError(
                f"c128a: {CASES_OPTION}={label}: no such folder ({path})"
            )
    config.stash[_folders_key] = folders
    path = config.getoption("c128a_known_failures")
    if path is not None:
        from c128a.plugin import known_failures

        names = known_failures.known_names(
            [case.name for _, folder in folders for case in case_files(folder)]
        )
        try:
            listed = known_failures.read_known_failures(config.invocation_params.dir / path, names)
        except known_failures.KnownFailuresError as exc:
            raise pytest.UsageError(f"c128a: {KNOWN_FAILURES_OPTION}: {exc}") from None
        known = known_failures.KnownFailures(config, listed)
        config.pluginmanager.register(known, known_failures.PLUGIN_NAME)
        verdicts_plugin.accept_not_run(known.accepted_not_run())


def pytest_report_header(config: pytest.Config) -> list[str]:
    from c128a.plugin.check_timeout import timeout_line
    from c128a.cases import case_files

    folders = config.stash.get(_folders_key, None)
    if folders is None:
        return []
    return [case_folders_line(folders, [len(case_files(path)) for _, path in folders]),
            timeout_line(*config.stash[_timeout_key])]
