"""Longest tests first under xdist (c128a/plugin/scheduling.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from c128a.plugin import scheduling

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")


def _item(nodeid: str, slow: bool = False):
    def get_closest_marker(name):
        return object() if slow and name == "slow" else None

    return SimpleNamespace(nodeid=nodeid, get_closest_marker=get_closest_marker)


def test_recorded_durations_order_the_tests_and_slow_ones_lead_without_them():
    items = [_item("a"), _item("b", slow=True), _item("c"), _item("d"), _item("e", slow=True)]
    scheduling.order_longest_first(items, {"c": 30.0, "d": 0.5})
    # c (30 s) before the unrecorded slow ones (the guess), ties in pytest's order.
    assert [item.nodeid for item in items] == ["c", "b", "e", "d", "a"]


@pytest.mark.slow
def test_a_run_records_durations_the_next_run_sorts_by(pytester, monkeypatch):
    # As under `pytest -n`: the child pytest inherits an xdist worker's
    # environment and must still record, as the controller it is.
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "8")
    pytester.makepyfile(test_two="""
        import time

        def test_quick():
            pass

        def test_long():
            time.sleep(0.3)
    """)
    # One worker: the order it runs the tests in is the order it sorted them
    # in (with two, which worker reports first is a race).
    run = ("--c128a-device=cpu", "-n", "1", "-p", "xdist", "-v")
    first = pytester.runpytest_subprocess(*run)
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(["c128a xdist scheduling: longest first*no recorded durations*"])
    recorded = json.loads((pytester.path / ".pytest_cache/v/c128a/durations").read_text())
    assert set(recorded) == {"test_two.py::test_quick", "test_two.py::test_long"}
    assert recorded["test_two.py::test_long"] >= 0.3
    second = pytester.runpytest_subprocess(*run)
    second.assert_outcomes(passed=2)
    second.stdout.fnmatch_lines(["c128a xdist scheduling: longest first*durations of 2 tests*"])
    started = [line.split()[0] for line in second.stdout.lines if line.startswith("test_two.py::")]
    assert started == ["test_two.py::test_long", "test_two.py::test_quick"], second.stdout.str()
