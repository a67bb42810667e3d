"""Longest tests first under pytest-xdist's ``--dist load``.

Most of the suite's tests take milliseconds; a few dozen take seconds to half
a minute (a child process that imports torch, a real fault, a sanitizer run).
Under xdist's own load scheduling the collection is handed out in runs of
consecutive tests, so the long tests of one module pile up on one worker and
the run waits for it long after the others are done. Here:

- every worker sorts the collection by its expected duration, longest first
  (:func:`expected_duration`: the duration recorded by the last run in
  pytest's cache, else a guess for tests marked ``slow``, else 0; a stable
  sort, so the order is the same on every worker and ties keep pytest's);
- the controller deals the first two tests to each worker round-robin and
  then one test at a time to whichever worker finishes one
  (:class:`LongestFirstScheduling`), so the long tests run side by side at
  the start and the short ones fill in around them;
- the controller records every test's duration for the next run
  (:class:`DurationRecorder`).

Only ``--dist load`` (the default of ``-n``) is changed; an explicit
``--maxschedchunk`` is kept.
"""

from __future__ import annotations

import pytest

DURATIONS_KEY = "c128a/durations"
"""pytest cache key: {node id: seconds of setup, call and teardown} of the
last run of each test."""
SLOW_GUESS_S = 10.0
"""The expected duration of a ``slow`` test the cache knows nothing of."""


def reorders(config: pytest.Config) -> bool:
    """Whether this run is scheduled longest first: xdist's load
    distribution with workers."""
    workers = config.getoption("numprocesses", None)
    return bool(workers) and config.getoption("dist", None) == "load"


def cached_durations(config: pytest.Config) -> dict[str, float]:
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    if cache is None:
        return {}
    value = cache.get(DURATIONS_KEY, {})
    if not isinstance(value, dict):
        return {}
    return {k: float(v) for k, v in value.items() if isinstance(v, (int, float))}


def expected_duration(item: pytest.Item, durations: dict[str, float]) -> float:
    if item.nodeid in durations:
        return durations[item.nodeid]
    return SLOW_GUESS_S if item.get_closest_marker("slow") else 0.0


def order_longest_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    items.sort(key=lambda item: -expected_duration(item, durations))


WORKER_INPUT_KEY = "c128a_longest_first"
"""Set by the controller in each worker's ``workerinput`` (xdist clears a
worker's own ``-n`` and ``--dist``), telling it to sort its collection."""


def worker_sorts(config: pytest.Config) -> bool:
    return bool(getattr(config, "workerinput", {}).get(WORKER_INPUT_KEY))


def scheduling_line(config: pytest.Config) -> str:
    known = len(cached_durations(config))
    source = (f"durations of {known} tests from the last run" if known
              else f"no recorded durations yet: tests marked slow first (guess {SLOW_GUESS_S:g} s)")
    return f"c128a xdist scheduling: longest first, one test at a time per worker ({source})"


class DurationRecorder:
    """Controller side: each test's setup, call and teardown time, written to
    pytest's cache at the end (merged with what it held, so a partial run
    keeps the other tests' durations)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.durations: dict[str, float] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.durations:
            return
        merged = cached_durations(self.config)
        merged.update({k: round(v, 3) for k, v in self.durations.items()})
        cache.set(DURATIONS_KEY, merged)


def make_scheduler(config: pytest.Config, log):
    """The controller's scheduler, built only when xdist asks for one."""
    from xdist.scheduler import LoadScheduling

    class LongestFirstScheduling(LoadScheduling):
        """xdist's load scheduling, except that the first tests are dealt
        round-robin and, unless ``--maxschedchunk`` says otherwise, each
        worker holds two tests (the one it runs and the next: xdist needs
        the next one to know which fixtures to tear down)."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            if config.getoption("maxschedchunk") is None:
                self.maxschedchunk = 1

        def schedule(self) -> None:
            if self.collection is not None:  # new nodes, or called again
                return super().schedule()
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return None
            self.collection = next(iter(self.node2collection.values()))
            self.pending[:] = range(len(self.collection))
            for _ in range(2):
                for node in self.nodes:
                    self._send_tests(node, 1)
            if not self.pending:
                for node in self.nodes:
                    node.shutdown()

    return LongestFirstScheduling(config, log)
