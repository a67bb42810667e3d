"""A time limit of its own for every conformance check, wherever it runs.

A target that hangs would hang the run for ever: the conformance suite runs
from a kernel's own repository, where no ini file sets pytest-timeout (if
it is installed at all), and pytest-timeout's default signal method does
not end a check stuck in native code (nor one Hypothesis reruns after the
signal's failure). So each check (a test marked ``conformance``) runs under
a watchdog thread: past its limit, the thread prints every thread's stack
and a line naming the check and the limit, and ends the process with
status 1. Without xdist that ends the run, red; under xdist it ends the
worker, which xdist reports as a crash of that check (a failure) and
replaces.

The limit: ``--c128a-check-timeout=SECONDS`` or ``$C128A_CHECK_TIMEOUT``;
else the timeout a user gave pytest-timeout (``--timeout``,
``$PYTEST_TIMEOUT``, the ini file's ``timeout``) plus :data:`GRACE_S`, so
that pytest-timeout's own method acts first and this one only where it
cannot; else :data:`~c128a.options.DEFAULT_CHECK_TIMEOUT_S`. 0: no limit.
"""

from __future__ import annotations

import faulthandler
import math
import os
import threading

import pytest

from c128a import options
from c128a.plugin.verdicts import check_name, shown_item

PLUGIN_NAME = "c128a-check-timeout"
OPTION = options.CHECK_TIMEOUT_OPTION
PYTEST_TIMEOUT_ENV = "PYTEST_TIMEOUT"  # pytest-timeout's own variable
GRACE_S = 30.0
"""Past a user's pytest-timeout limit, the time its own method has to end
the check before this watchdog does."""


def _seconds(raw, origin: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise pytest.UsageError(
            f"c128a: {origin}={raw!r} is not a number of seconds; give one (0: no limit)")
    return value


def _ini_timeout(config: pytest.Config) -> str:
    try:
        value = config.getini("timeout")  # registered by pytest-timeout, when installed
    except ValueError:
        return ""
    return str(value or "").strip()


def resolve_check_timeout(config: pytest.Config, environ=os.environ) -> tuple[float, str]:
    """(seconds, where they came from) of the checks' limit (0: none)."""
    given = config.getoption("c128a_check_timeout", None)
    if given is not None:
        return _seconds(given, OPTION.pytest), OPTION.pytest
    if environ.get(OPTION.env, "").strip():
        return _seconds(environ[OPTION.env].strip(), f"${OPTION.env}"), f"${OPTION.env}"
    given_to_pytest_timeout = (
        ("--timeout", config.getoption("timeout", None)),
        (f"${PYTEST_TIMEOUT_ENV}", environ.get(PYTEST_TIMEOUT_ENV, "").strip() or None),
        ("the ini file's timeout", _ini_timeout(config) or None),
    )
    for origin, raw in given_to_pytest_timeout:
        if raw is not None:
            seconds = _seconds(raw, origin)
            # pytest-timeout's 0 is no limit: so is this one then.
            return (seconds + GRACE_S if seconds else 0.0,
                    f"pytest-timeout's {origin} {seconds:g} s" + (
                        f", plus {GRACE_S:g} s for its own method to act first" if seconds
                        else ""))
    return options.DEFAULT_CHECK_TIMEOUT_S, "default"


def timeout_line(seconds: float, origin: str) -> str:
    """Header line: the checks' limit and where it came from."""
    if not seconds:
        return f"c128a check timeout: none (from {origin})"
    return (f"c128a check timeout: {seconds:g} s a check (from {origin}); a check past it "
            "ends its process, named")


class CheckTimeout:
    """Runs each conformance check under a watchdog (every process that runs tests)."""

    def __init__(self, seconds: float, origin: str):
        self.seconds, self.origin = seconds, origin

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        name = check_name(item)
        if not self.seconds or name is None:
            return (yield)
        watchdog = threading.Timer(self.seconds, self._expired, (item, name))
        watchdog.daemon = True
        watchdog.name = "c128a-check-timeout"
        watchdog.start()
        try:
            return (yield)
        finally:
            watchdog.cancel()

    def _expired(self, item: pytest.Item, name: str) -> None:
        from c128a.targets import exits

        faulthandler.dump_traceback(file=exits.report_fd(), all_threads=True)
        exits.end_process(
            f"c128a: check {shown_item(item)} ({name}) ran past its time limit of "
            f"{self.seconds:g} s (from {self.origin}; {OPTION.pytest} or ${OPTION.env} sets "
            "it): its process ends here, stacks above; a check that does not finish is not a "
            "pass", int(pytest.ExitCode.TESTS_FAILED))
