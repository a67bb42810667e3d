"""The verdict of a conformance run (:mod:`c128a.plugin.verdicts`): what
ran, passed, failed, was expected to fail and did not run, and a check that
did not run for no missing device or tool failing the run unless allowed.

A stand-in conformance module holds one check of each outcome, so that
each run takes a second; one run uses the real ``test_consumers`` module."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from c128a.conformance.requirements import (
    MissingRequirement,
    missing_requirement_of,
    needs,
    skip_for_want_of,
)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

CHECKS = """
import pytest

@pytest.mark.conformance("views")
def test_passes():
    pass

@pytest.mark.conformance("padding")
def test_fails():
    assert False, "the target's failure"

@pytest.mark.conformance("rejects_bad_input")
def test_declares_its_failure():
    pytest.xfail("the target declares validates_input=False")

@pytest.mark.conformance("replay")
@pytest.mark.cuda
def test_needs_cuda():
    raise AssertionError("must not run on the CPU")

@pytest.mark.conformance("compile_keys")
def test_cannot_run_on_this_target():
    pytest.skip("target t launches nothing through a keyed launcher")

def test_not_a_check():
    pytest.skip("the suite's own test, not a check of the target")
"""
NOT_RUN_LINE = ("  not run: test_checks.py::test_cannot_run_on_this_target (compile_keys): "
                "target t launches nothing through a keyed launcher")


@pytest.fixture
def run_checks(pytester, runpytest_on_the_cpu):
    """Run the checks file through pytest on the CPU, where the check that
    needs CUDA is skipped: in a child when ``subprocess=True``."""

    def run(*args, subprocess=False):
        pytester.makepyfile(test_checks=CHECKS)
        return runpytest_on_the_cpu("--c128a-target=reference", "-p", "no:randomly",
                                    "-p", "no:cacheprovider", *args, subprocess=subprocess)

    return run


def test_only_the_suite_s_own_skip_for_a_missing_device_or_tool_excuses_a_check():
    for requirement, detail in (("CUDA", "no GPU here"), ("compute-sanitizer", "not found")):
        with pytest.raises(MissingRequirement) as skipped:
            skip_for_want_of(requirement, detail)
        assert missing_requirement_of(skipped) == requirement
        assert skipped.value.msg == needs(requirement, detail) == f"needs {requirement}: {detail}"
    # The same words from anyone else (a target's own skip) excuse nothing.
    with pytest.raises(pytest.skip.Exception) as worded:
        pytest.skip(needs("CUDA", "the target says so"))
    assert missing_requirement_of(worded) is None
    assert missing_requirement_of(None) is None
    with pytest.raises(ValueError, match="requirement='a consumer' is not a device or tool"):
        needs("a consumer", "the release lacks it")


def test_the_summary_counts_each_outcome_and_names_what_did_not_run(run_checks):
    result = run_checks("-k", "not test_fails")
    result.stdout.fnmatch_lines([
        "c128a conformance: 2 checks ran: 1 passed, 0 failed, 1 expected failures; 2 not run "
        "(CUDA: 1, other reasons: 1)",
        "  not run (CUDA missing): replay",
        NOT_RUN_LINE,
    ])


def test_a_check_that_did_not_run_fails_the_run(pytester, run_checks):
    # Before: a skipped check was a green run (exit 0) with nothing said.
    result = run_checks("-k", "not test_fails", "--junitxml", "report.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*1 check(s) of the target did not run, for a reason other than a missing device or "
        "tool; a check that did not run is not a pass:",
        "  test_checks.py::test_cannot_run_on_this_target (compile_keys): target t launches "
        "nothing through a keyed launcher",
        "Make them run, deselect them (-k, -m), accept one in a known-failures file ('not run: "
        "NAME: reason'), or allow them all with --c128a-allow-not-run ($C128A_ALLOW_NOT_RUN=1).",
        "FAILED c128a::not_run - 1 check(s) of the target did not run*",
    ])
    outcomes = result.parseoutcomes()
    assert (outcomes["failed"], outcomes["passed"], outcomes["skipped"]) == (1, 1, 3)
    tree = ElementTree.parse(pytester.path / "report.xml")
    failures = [case.get("name") for case in tree.iter("testcase")
                if case.find("failure") is not None]
    assert failures == ["not_run"]


@pytest.mark.parametrize("how", [["--c128a-allow-not-run"], ["env"]], ids=["option", "env"])
def test_a_check_that_did_not_run_is_allowed_only_when_asked(monkeypatch, how, run_checks):
    if how == ["env"]:
        monkeypatch.setenv("C128A_ALLOW_NOT_RUN", "1")
        how = []
    result = run_checks("-k", "not test_fails", *how)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "c128a conformance: 2 checks ran: 1 passed, 0 failed, 1 expected failures; 2 not run "
        "(CUDA: 1, other reasons: 1)",
        NOT_RUN_LINE,
        "  (allowed by *: the checks above did not run, and do not fail the run)",
    ])


def test_a_missing_device_alone_does_not_fail_the_run(run_checks):
    result = run_checks("-k", "passes or cuda")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "c128a conformance: 1 checks ran: 1 passed, 0 failed, 0 expected failures; 1 not run "
        "(CUDA: 1)",
    ])
    assert "c128a::not_run" not in result.stdout.str()


def test_a_bad_allow_value_is_a_usage_error(monkeypatch, run_checks):
    monkeypatch.setenv("C128A_ALLOW_NOT_RUN", "perhaps")
    result = run_checks()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*c128a: invalid value 'perhaps' from $C128A_ALLOW_NOT_RUN; "
                                 "use 1 (on) or 0 (off)*"])


@pytest.mark.slow
def test_the_verdict_is_the_same_under_xdist(run_checks):
    result = run_checks("-n", "2", subprocess=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "c128a conformance: 3 checks ran: 1 passed, 1 failed, 1 expected failures; 2 not run "
        "(CUDA: 1, other reasons: 1)",
        NOT_RUN_LINE,
    ])
    assert result.parseoutcomes()["failed"] == 2  # test_fails, and the check that did not run


@pytest.mark.slow
def test_a_conformance_check_the_target_cannot_have_is_not_applicable(pytester):
    """The real module: the reference target declares no keyed launcher, so
    the serving loop's compile keys are not a check of it: listed as not
    applicable, not a check that did not run (which failed this run before)."""
    result = pytester.runpytest_subprocess(
        "--pyargs", "c128a.conformance.test_consumers", "--c128a-device=cpu",
        "--c128a-target=reference", "-p", "no:randomly",
    )
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "c128a conformance: 4 checks ran: 4 passed, 0 failed, 0 expected failures; 0 not run; "
        "1 not applicable",
        "  not applicable (the target declares no keyed launcher (launchers): it has no "
        "compile keys): compile_keys (1 test)",
        "*4 passed, 1 deselected*",
    ])


# ---------------------------------------------------------------- who may excuse a check


WORDED_AS_A_MISSING_DEVICE = """
import pytest

@pytest.mark.conformance("views")
def test_passes():
    pass

@pytest.mark.conformance("padding")
def test_skips_in_the_words_of_a_missing_device():
    pytest.skip("needs CUDA: said by the target, not found missing by the suite")
"""


def test_a_skip_worded_as_a_missing_device_excuses_nothing(pytester, runpytest_on_the_cpu):
    # Before: any reason starting "needs CUDA: " was taken for a missing device: green.
    pytester.makepyfile(test_worded=WORDED_AS_A_MISSING_DEVICE)
    result = runpytest_on_the_cpu("--c128a-target=reference", "-p", "no:randomly",
                                  "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "c128a conformance: 1 checks ran: 1 passed, 0 failed, 0 expected failures; 1 not run "
        "(other reasons: 1)",
        "  not run: test_worded.py::test_skips_in_the_words_of_a_missing_device (padding): "
        "needs CUDA: said by the target, not found missing by the suite",
        "FAILED c128a::not_run - 1 check(s) of the target did not run*",
    ])


# ---------------------------------------------------------------- not applicable, nothing checked


NOT_APPLICABLE = """
import pytest

def _declares_launchers(target):
    return bool(getattr(target, "launchers", ()))

@pytest.mark.conformance("views")
def test_passes():
    pass

@pytest.mark.conformance("compile_keys")
@pytest.mark.applies_to.with_args(_declares_launchers, why="it declares no keyed launcher")
@pytest.mark.parametrize("step", [1, 2])
def test_keyed(step):
    raise AssertionError("never collected for a target without keyed launchers")
"""


def test_a_check_the_target_cannot_have_is_listed_not_applicable(pytester, runpytest_on_the_cpu):
    """Not applicable: deselected, named in the summary, and not a failure
    (under xdist: test_a_check_whose_worker_crashed_did_not_pass)."""
    pytester.makepyfile(test_applicable=NOT_APPLICABLE)
    result = runpytest_on_the_cpu("--c128a-target=reference", "-p", "no:randomly",
                                  "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "c128a conformance: 1 checks ran: 1 passed, 0 failed, 0 expected failures; 0 not run; "
        "2 not applicable",
        "  not applicable (it declares no keyed launcher): compile_keys (2 tests)",
    ])


def test_a_run_whose_checks_all_did_not_run_checked_nothing(run_checks):
    # Before: one check skipped for want of CUDA, nothing else: green.
    result = run_checks("-k", "cuda")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "no check of the target ran: the 1 selected did not run (CUDA: 1); a run that checked "
        "nothing is not a pass.*",
        "c128a conformance: 0 checks ran: 0 passed, 0 failed, 0 expected failures; 1 not run "
        "(CUDA: 1)",
        "FAILED c128a::nothing_checked - no check of the target ran*",
    ])


# ---------------------------------------------------------------- a crashed xdist worker


CRASHING = """
import os
import signal

import pytest

@pytest.mark.conformance("views")
def test_passes():
    pass

@pytest.mark.conformance("padding")
def test_kills_its_process():
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_check_whose_worker_crashed_did_not_pass(pytester):
    # Before: its set-up had passed, its call never reported: counted passed.
    # Beside it, checks that do not apply: the controller, which collects
    # nothing, lists them from its workers.
    pytester.makepyfile(test_crashing=CRASHING, test_applicable=NOT_APPLICABLE)
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "--c128a-target=reference",
                                           "-p", "no:randomly", "-p", "no:cacheprovider",
                                           "-n", "1")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "c128a conformance: 3 checks ran: 2 passed, 1 failed, 0 expected failures; 0 not run; "
        "2 not applicable",
        "  not applicable (it declares no keyed launcher): compile_keys (2 tests)",
        "  crashed: test_crashing.py::test_kills_its_process (padding): the worker running it "
        "died; it did not pass",
    ])


def test_a_check_whose_call_never_reported_did_not_run():
    from c128a.plugin.verdicts import NEVER_REPORTED, NOT_RUN, Tally

    tally = Tally()
    setup = pytest.TestReport("m.py::t", ("m.py", 0, "t"), {}, "passed", None, "setup")
    tally.add(setup.nodeid, "views", setup)
    tally.close()
    [outcome] = tally.outcomes.values()
    assert (outcome.verdict, outcome.reason) == (NOT_RUN, NEVER_REPORTED)
    assert tally.unexcused() == [outcome]
