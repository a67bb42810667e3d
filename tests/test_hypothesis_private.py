"""Each private Hypothesis name ``c128a.hypothesis_private`` relies on still
does what the suite needs of it: one test per touch, failing with the name
and the installed Hypothesis version. Run these first when widening the
Hypothesis range in ``pyproject.toml``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import __version__ as HYPOTHESIS_VERSION
from hypothesis import given, reproduce_failure, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context
from hypothesis.database import InMemoryExampleDatabase
from hypothesis.errors import DidNotReproduce
from hypothesis.internal import observability
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from c128a import hypothesis_private
from c128a.hypothesis_private import (
    FailureObserver,
    add_digest,
    blob_misfit,
    drawn_seconds,
    reproduce_blob,
)

QUIET = settings(database=None, deadline=None, max_examples=5, print_blob=True)


def changed(name: str, what: str) -> str:
    """The message of a touch Hypothesis changed under the suite."""
    return (f"hypothesis {HYPOTHESIS_VERSION}: {name} {what}. c128a.hypothesis_private "
            "relies on it; adapt that module, or cap hypothesis below this release in "
            "pyproject.toml")


class Failed(Exception):
    pass


def same_source_test(draws: list, digest: str | None = None):
    """A test whose source is the same every call, as every property's is;
    ``draws`` collects what it draws."""

    def run(value):
        draws.append(value)

    if digest is not None:
        add_digest(run, digest)
    return run


class KeyRecorder(InMemoryExampleDatabase):
    """An example database that remembers the keys saved under."""

    def __init__(self):
        super().__init__()
        self.keys: set[bytes] = set()

    def save(self, key: bytes, value: bytes) -> None:
        self.keys.add(key)
        super().save(key, value)


def test_add_digest_separates_derandomised_seeds():
    """``_hypothesis_internal_add_digest`` still feeds the digest the
    derandomised seed comes from."""

    def draws_of(digest):
        draws: list = []
        test = settings(QUIET, derandomize=True, max_examples=10)(
            given(st.integers(0, 2**64))(same_source_test(draws, digest))
        )
        test()
        return draws

    assert draws_of(None) == draws_of(None), "derandomize=True no longer repeats the draws"
    assert draws_of("c128a:a") == draws_of("c128a:a"), "derandomize=True no longer repeats"
    assert draws_of("c128a:a") != draws_of("c128a:b"), changed(
        "_hypothesis_internal_add_digest",
        "no longer changes the derandomised seed: every property would draw the same examples",
    )


def test_add_digest_separates_database_keys():
    """``_hypothesis_internal_add_digest`` still feeds the digest the example
    database key comes from."""

    def keys_of(digest):
        database = KeyRecorder()

        def fail(value):
            raise Failed

        add_digest(fail, digest)
        test = settings(QUIET, database=database, print_blob=False)(given(st.integers())(fail))
        with pytest.raises(Failed):
            test()
        return database.keys

    a, b = keys_of("c128a:a"), keys_of("c128a:b")
    assert a and b, "a failing test saved nothing in its example database"
    assert not a & b, changed(
        "_hypothesis_internal_add_digest",
        "no longer changes the example-database key: every property would replay the "
        "failures of all the others",
    )


def draw_times_now():
    """The running example's ``draw_times``, checked to be what
    ``drawn_seconds`` sums."""
    data = getattr(current_build_context(), "data", None)
    assert data is not None, changed("current_build_context().data", "is gone during a test")
    assert hasattr(data, "draw_times"), changed(
        "ConjectureData.draw_times", "is gone: drawn_seconds() would read 0.0 for every draw"
    )
    draw_times = data.draw_times
    assert isinstance(draw_times, dict) and all(
        isinstance(seconds, float) for seconds in draw_times.values()
    ), changed("ConjectureData.draw_times", f"is no longer a mapping to seconds: {draw_times!r}")
    return draw_times


def test_drawn_seconds_reads_the_draw_times_of_a_given_test():
    seen: list = []

    @QUIET
    @given(st.lists(st.integers(), min_size=50, max_size=50))
    def drawing(values):
        draw_times = draw_times_now()
        seen.append((dict(draw_times), drawn_seconds()))

    drawing()
    assert seen
    for draw_times, drawn in seen:
        assert any(key.startswith("generate:") for key in draw_times), changed(
            "ConjectureData.draw_times", f"no longer records the argument draws: {draw_times!r}"
        )
        assert drawn == pytest.approx(sum(draw_times.values())) and drawn > 0.0, changed(
            "ConjectureData.draw_times", f"reads {drawn} s through drawn_seconds(): {draw_times!r}"
        )
    assert drawn_seconds() == 0.0  # outside an example


def test_drawn_seconds_reads_a_state_machines_rule_draws():
    seen: list = []

    class Drawing(RuleBasedStateMachine):
        @rule(values=st.lists(st.integers(), min_size=20, max_size=20))
        def step(self, values):
            seen.append(dict(draw_times_now()))

    run_state_machine_as_test(
        Drawing, settings=settings(QUIET, stateful_step_count=3, max_examples=3)
    )
    assert seen
    assert any(draw_times for draw_times in seen), changed(
        "ConjectureData.draw_times", "no longer records a state machine's rule draws"
    )


def failing_blob() -> str:
    """The blob Hypothesis prints for a test drawing one integer, failing
    on any: read from its notes (public), not from the module under test."""

    @QUIET
    @given(st.integers())
    def fails(value):
        raise Failed

    with pytest.raises(Failed) as raised:
        fails()
    notes = "\n".join(getattr(raised.value, "__notes__", ()))
    match = re.search(r"@reproduce_failure\('[^']*', (b'[^']*')\)", notes)
    assert match, f"hypothesis {HYPOTHESIS_VERSION} printed no blob: {notes!r}"
    return ast.literal_eval(match.group(1)).decode()


def run_pinned(draw, blob: str) -> list:
    """``blob_misfit()`` of a test drawing ``draw``, pinned to ``blob``."""
    misfits: list = []

    @settings(database=None, deadline=None)
    @given(draw)
    def pinned(value):
        assert hasattr(current_build_context().data, "misaligned_at"), changed(
            "ConjectureData.misaligned_at", "is gone: a replay could not tell a misfitting blob"
        )
        misfits.append(blob_misfit())

    reproduce_failure(HYPOTHESIS_VERSION, blob.encode())(pinned)
    with pytest.raises(DidNotReproduce):
        pinned()
    return misfits


def test_blob_misfit_is_none_for_a_fitting_blob():
    assert run_pinned(st.integers(), failing_blob()) == [None]


def test_blob_misfit_reads_misaligned_at_for_a_misfitting_blob():
    misfits = run_pinned(st.text(), failing_blob())
    assert len(misfits) == 1 and misfits[0] is not None, changed(
        "ConjectureData.misaligned_at", "is not set when a blob's choice misfits the draw"
    )
    assert "does not fit the string" in misfits[0], misfits[0]


def test_failure_observer_reports_the_failing_blob():
    """``hypothesis.internal.observability``'s callbacks still deliver failing
    test cases whose ``metadata.reproduction_decorator`` holds the blob, and
    ``OBSERVABILITY_COLLECT_COVERAGE`` is still the coverage switch."""
    failures: list = []
    coverage = observability.OBSERVABILITY_COLLECT_COVERAGE
    observer = FailureObserver(lambda blob, representation: failures.append((blob, representation)))

    @given(st.integers())
    def fails_from_ten(value):
        if value >= 10:
            raise Failed

    @given(st.integers())
    def fails(value):
        raise Failed

    observer.start()
    try:
        assert observability.OBSERVABILITY_COLLECT_COVERAGE is False
        with pytest.raises(Failed) as raised:
            settings(QUIET, max_examples=200)(fails_from_ten)()
    finally:
        observer.stop()
    assert observability.OBSERVABILITY_COLLECT_COVERAGE is coverage
    assert failures, changed(
        "hypothesis.internal.observability.add_observability_callback",
        "delivers no failing test_case observation: a fuzz case would have no blob",
    )
    blob, representation = failures[-1]
    assert blob is not None, changed(
        "TestCaseObservation.metadata.reproduction_decorator", "is empty for a failing test case"
    )
    assert "value=10" in representation, representation
    notes = "\n".join(raised.value.__notes__)
    assert blob in notes, f"the observed blob {blob!r} is not the one Hypothesis printed: {notes!r}"

    # Stopped, it hears nothing more.
    failures.clear()
    with pytest.raises(Failed):
        QUIET(fails)()
    assert failures == []


def test_reproduce_blob_reads_the_decorator_text():
    assert reproduce_blob("@reproduce_failure('6.170.17', b'AXicY2BgAAAABAAB')") == (
        "AXicY2BgAAAABAAB"
    )


def test_only_hypothesis_private_touches_private_names():
    """The one-module rule: elsewhere in the package, no private Hypothesis
    name, not even in a docstring."""
    private = re.compile(
        r"hypothesis\.internal|_hypothesis_internal|current_build_context|misaligned_at|draw_times"
    )
    package = Path(hypothesis_private.__file__).parent
    touching = sorted(
        str(path.relative_to(package.parent))
        for path in package.rglob("*.py")
        if path != Path(hypothesis_private.__file__) and private.search(path.read_text())
    )
    assert touching == [], f"private Hypothesis names outside hypothesis_private.py: {touching}"


def test_hypothesis_requirement_is_a_range_that_keeps_a_teams_newer_release():
    """c128a installs beside a team's own Hypothesis: its requirement runs
    from the oldest release a machine runs to the next major release, so
    installing c128a never downgrades a newer one (6.170.27 was the newest
    when the pin <=6.170.17 was lifted). CI's second job proves the newest."""
    import tomllib

    from packaging.requirements import Requirement

    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    (requirement,) = [Requirement(d) for d in dependencies if Requirement(d).name == "hypothesis"]
    specifier = requirement.specifier
    assert {s.operator for s in specifier} == {">=", "<"}, (
        f"hypothesis requirement {specifier} pins or caps below a major release")
    for version, kept in (("6.168.3", True), ("6.170.27", True), ("6.999.0", True),
                          ("6.168.2", False), ("7.0.0", False)):
        assert specifier.contains(version) is kept, (version, str(specifier))
