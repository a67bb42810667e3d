"""The options of a conformance run: folders of cases (``--c128a-cases``),
the known-failures file (``--c128a-known-failures``) and the
``conformance`` marker every check of the package carries."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from c128a.conformance import KEPT_CASES, check_names
from c128a.failures import HarnessError
from c128a.plugin import known_failures
from c128a.plugin.known_failures import KnownFailuresError, read_known_failures

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

KEPT = "matches_oracle-b839eb151f69.json"  # the kept packed-stride case
NAMES = known_failures.known_names([KEPT])
POLICY_MUTANT = "c128a.mutants:width_undercovers"  # fails width_policy only, at the capture edge


# ---------------------------------------------------------------- the file


def test_a_file_lists_names_with_reasons_and_comments(tmp_path):
    path = tmp_path / "known.txt"
    path.write_text(
        "# vLLM 0.34.0 held to inert (vllm#55177)\n\n"
        "padding: padding rows hold slot ids, see vllm#55177\n"
        f"  {KEPT} :  the packed-stride case\n"
    )
    listed = read_known_failures(path, NAMES)
    assert {name: (e.reason, e.line) for name, e in listed.items()} == {
        "padding": ("padding rows hold slot ids, see vllm#55177", 3),
        KEPT: ("the packed-stride case", 4),
    }


@pytest.mark.parametrize(("text", "message"), [
    ("padding\n", r"known.txt:1: 'padding' is not 'NAME: reason'"),
    ("# ok\npadding:   \n", r"known.txt:2: 'padding:' is not 'NAME: reason'"),
    (": no name\n", r"known.txt:1: ': no name' is not 'NAME: reason'"),
    ("paddding: typo\n", r"known.txt:1: 'paddding' names no property and no regression case"),
    ("nope.json: a case not here\n", r"known.txt:1: 'nope.json' names no property"),
    ("views: one\n\nviews: two\n", r"known.txt:3: 'views' is listed already on line 1"),
])
def test_a_malformed_line_is_named_with_its_file_and_line(tmp_path, text, message):
    path = tmp_path / "known.txt"
    path.write_text(text)
    with pytest.raises(KnownFailuresError, match=message):
        read_known_failures(path, NAMES)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(KnownFailuresError, match=r"cannot read .*absent.txt"):
        read_known_failures(tmp_path / "absent.txt", NAMES)


def test_only_a_failed_check_is_an_expected_failure():
    def info(exc):
        try:
            raise exc
        except BaseException:
            return pytest.ExceptionInfo.from_current()

    assert known_failures.expected(info(AssertionError("[views] ...")))
    assert known_failures.expected(info(ExceptionGroup("two", [AssertionError(), AssertionError()])))
    with pytest.raises(pytest.fail.Exception) as failed:
        pytest.fail("still fails")
    assert known_failures.expected(failed)
    assert not known_failures.expected(info(HarnessError("the suite's own fault")))
    assert not known_failures.expected(info(TypeError("a bug")))
    assert not known_failures.expected(None)


# ---------------------------------------------------------------- the marker


def test_every_check_of_the_package_carries_a_name_a_file_can_use(pytester, c128a_device):
    # In this process, so on the session's device: its kernels are imported for it.
    items, _ = pytester.inline_genitems("--pyargs", "c128a.conformance", "-p", "no:cacheprovider",
                                        f"--c128a-device={c128a_device.type}")
    assert len(items) > 50
    known = set(check_names())
    cases = {path.name for path in KEPT_CASES.glob("*.json")}
    unnamed = []
    for item in items:
        marker = item.get_closest_marker("conformance")
        if marker is None:
            unnamed.append(item.name)
            continue
        (name,) = marker.args
        assert name in (cases if item.originalname == "test_saved_case_passes" else known), item
    assert unnamed == ["test_the_kept_cases_shipped_with_the_package"]


# ---------------------------------------------------------------- runs


@pytest.mark.slow
def test_a_missing_cases_folder_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--pyargs", "c128a.conformance.test_regressions",
                                           "--c128a-device=cpu", "--c128a-cases", "nowhere")
    result.stderr.fnmatch_lines(["*c128a: --c128a-cases=nowhere: no such folder*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.slow
def test_a_bad_line_stops_the_run_before_it_starts(pytester):
    pytester.path.joinpath("known.txt").write_text("# fine\npaddding: typo\n")
    result = pytester.runpytest_subprocess("--pyargs", "c128a.conformance.test_width_policy",
                                           "--c128a-device=cpu", "--c128a-known-failures",
                                           "known.txt")
    result.stderr.fnmatch_lines(["*c128a: --c128a-known-failures: *known.txt:2: 'paddding' names*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.slow
def test_listed_failures_are_expected_and_the_rest_still_pass(pytester):
    pytester.path.joinpath("known.txt").write_text(
        "width_policy: undercovers the capture edge\n"
        f"{KEPT}: the packed-stride case, not this target's\n"
    )
    result = pytester.runpytest_subprocess(
        "--pyargs", "c128a.conformance.test_width_policy", "--c128a-device=cpu",
        f"--c128a-target={POLICY_MUTANT}", "--c128a-known-failures", "known.txt",
        "--hypothesis-profile=ci", "-rx",
    )
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("xfailed", 0) >= 1 and outcomes["passed"] >= 1
    result.stdout.fnmatch_lines([
        "c128a known failures (known.txt): 2 listed, 1 failed as expected, 0 passed (stale), "
        "1 not run",
        "XFAIL *test_width_policy_at_every_model_len* - known failure (known.txt:1): "
        "undercovers the capture edge",
    ])


@pytest.mark.slow
def test_a_listed_check_that_passes_fails_the_run_under_xdist(pytester):
    pytester.path.joinpath("known.txt").write_text("width_policy: stale: fixed long ago\n")
    result = pytester.runpytest_subprocess(
        "--pyargs", "c128a.conformance.test_width_policy", "--c128a-device=cpu",
        "--c128a-target=reference", "--c128a-known-failures", "known.txt",
        "--hypothesis-profile=ci", "-n", "2", "--junitxml", "report.xml",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*known.txt:1 lists 'width_policy' as a known failure (stale: fixed long ago), but it "
        "passed: 42 test(s) passed and none failed. Remove the line.",
        "  passed: *test_*",
        "  and 39 more",
        "c128a known failures (known.txt): 1 listed, 0 failed as expected, 1 passed (stale), "
        "0 not run",
        "FAILED known.txt::width_policy - known.txt:1 lists 'width_policy' as a known*",
    ])
    assert result.parseoutcomes()["failed"] == 1
    tree = ElementTree.parse(pytester.path / "report.xml")
    failures = [case for case in tree.iter("testcase") if case.find("failure") is not None]
    assert [case.get("name") for case in failures] == ["width_policy"]
