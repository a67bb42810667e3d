"""The options of a conformance run: folders of cases (``--c128a-cases``),
the known-failures file (``--c128a-known-failures``) and the
``conformance`` marker every check of the package carries."""

from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from c128a.conformance import KEPT_CASES, check_names
from c128a.conformance.regression_cases import UncheckableCase
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
    with pytest.raises(UncheckableCase) as uncheckable:
        raise UncheckableCase("case x.json cannot be replayed here")
    assert not known_failures.expected(uncheckable)  # a fault of the case, not the target's
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


# ---------------------------------------------------------------- verdicts of cases and files


def device(c128a_device) -> str:
    """The option for a run in this process: the session's device (a CUDA
    session refuses the CPU once its kernels are imported)."""
    return f"--c128a-device={c128a_device.type}"


REGRESSIONS = ("--pyargs", "c128a.conformance.test_regressions",
               "--c128a-target=reference", "-p", "no:randomly", "-p", "no:cacheprovider")


def _case_folder(pytester, **cases: dict | bytes) -> Path:
    """A folder of case files: each a kept case's JSON changed by ``cases[name]``
    (a dict of fields to replace, None removing one), or raw bytes."""
    folder = pytester.mkdir("cases")
    kept = json.loads((KEPT_CASES / "matches_oracle-64469dd5424e.json").read_text())
    for name, change in cases.items():
        path = folder / name
        if isinstance(change, bytes):
            path.write_bytes(change)
            continue
        data = {**kept, **{k: v for k, v in change.items() if v is not None}}
        for key in [k for k, v in change.items() if v is None]:
            data.pop(key)
        path.write_text(json.dumps(data))
    return folder


def _truncated_case() -> bytes:
    text = (KEPT_CASES / "matches_oracle-64469dd5424e.json").read_bytes()
    return text[: len(text) // 2]


def test_a_listed_corrupt_case_is_an_error_not_an_expected_failure(pytester, c128a_device):
    # Before: "1 failed as expected", exit 0, and the line could never go stale.
    _case_folder(pytester, **{"truncated.json": _truncated_case()})
    pytester.path.joinpath("known.txt").write_text("truncated.json: we know it fails\n")
    result = pytester.runpytest(*REGRESSIONS, device(c128a_device), "--c128a-cases", "cases",
                                "--c128a-known-failures", "known.txt", "-k", "truncated")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "malformed case, no verdict on the target: */cases/truncated.json: field '<file>': "
        "not JSON: *",
        "c128a known failures (known.txt): 1 listed, 0 failed as expected, 0 passed (stale), "
        "1 not run",
    ])
    # The file named once in its failure: no chained copies of the message.
    section = result.stdout.str().split("FAILURES")[1].split("c128a conformance")[0]
    assert section.count("truncated.json: field") == 1, section


def test_a_case_that_cannot_be_replayed_fails_naming_the_file(pytester, c128a_device):
    # Before: skipped, exit 0 (c128a replay said CANNOT REPLAY, exit 2).
    _case_folder(pytester, **{"no-batch.json": {"batch": None, "reproduce_blob": "garbage!!"}})
    result = pytester.runpytest(*REGRESSIONS, device(c128a_device), "--c128a-cases", "cases",
                                "-k", "no-batch")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1)
    # Why the blob cannot drive it depends on the Hypothesis installed (another
    # release's blob is refused before it is read).
    result.stdout.fnmatch_lines([
        "case */cases/no-batch.json cannot be replayed here, so it gives no verdict on the "
        "target: *",
        "Record it again (c128a fuzz) or remove it from its folder.",
    ])


def test_a_sanitizer_case_skips_on_the_cpu_for_want_of_cuda(pytester, runpytest_on_the_cpu):
    _case_folder(pytester, **{"memcheck.json": {"property": "sanitizer_memcheck"}})
    # Beside a kept case that runs: a run whose only check needs CUDA checked nothing.
    result = runpytest_on_the_cpu(*REGRESSIONS, "--c128a-cases", "cases", "-rs",
                                  "-k", "memcheck or 64469dd5424e")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "c128a conformance: 1 checks ran: 1 passed, 0 failed, 0 expected failures; 1 not run "
        "(CUDA: 1)",
        "  not run (CUDA missing): memcheck.json",
        "SKIPPED * needs CUDA: a sanitizer_memcheck case replays on a GPU only (device cpu)",
    ])


LISTED_CHECKS = """
import pytest

@pytest.mark.conformance("compile_keys")
def test_cannot_run_on_this_target():
    pytest.skip("target t launches nothing through a keyed launcher")

@pytest.mark.conformance("replay")
@pytest.mark.cuda
def test_needs_cuda():
    raise AssertionError("must not run on the CPU")

@pytest.mark.conformance("rejects_bad_input")
def test_declares_its_failure():
    pytest.xfail("the target declares validates_input=False")
"""


def test_a_listed_check_that_did_not_run_fails_the_run(pytester, runpytest_on_the_cpu):
    # Before: the run was green, the line counted "not run" and never judged.
    pytester.makepyfile(test_listed=LISTED_CHECKS)
    pytester.path.joinpath("known.txt").write_text(
        "compile_keys: no keyed launchers\nreplay: fails on a GPU\n"
        "rejects_bad_input: checks with assert\n"
    )
    result = runpytest_on_the_cpu("--c128a-target=reference", "-p", "no:randomly",
                                  "--c128a-known-failures", "known.txt",
                                  "--c128a-allow-not-run")  # only the listed line fails the run
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*known.txt:1 lists 'compile_keys' as a known failure (no keyed launchers), but it did "
        "not run: 1 test(s) skipped, none failed or passed, so the line cannot be judged.*",
        "  skipped: *test_cannot_run_on_this_target: target t launches nothing*",
        "c128a known failures (known.txt): 3 listed, 1 failed as expected, 0 passed (stale), "
        "2 not run (1 of them skipped, which fails the run)",
        "FAILED known.txt::compile_keys - known.txt:1 lists 'compile_keys'*",
    ])
    assert result.parseoutcomes()["failed"] == 1  # replay needs CUDA: not judged here


@pytest.mark.slow
def test_a_named_pipe_as_the_known_failures_file_is_refused(pytester):
    # Before: the run waited for a writer for ever.
    fifo = pytester.path / "known.fifo"
    os.mkfifo(fifo)
    result = pytester.runpytest_subprocess(*REGRESSIONS, "--c128a-device=cpu",
                                           "--c128a-known-failures", "known.fifo",
                                           "--co", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*c128a: --c128a-known-failures: *known.fifo is a named pipe "
                                 "(FIFO), not a regular file; name a regular file*"])


def test_a_byte_order_mark_is_not_part_of_the_first_name(tmp_path):
    path = tmp_path / "known.txt"
    path.write_bytes("padding: slot ids, not -1\n".encode("utf-8-sig"))
    assert list(read_known_failures(path, NAMES)) == ["padding"]


def test_a_case_whose_name_holds_a_colon_is_found_by_its_whole_name(tmp_path):
    path = tmp_path / "known.txt"
    path.write_text("matches_oracle-a:b.json: a case named with a colon\n"
                    "padding: slot ids: not -1\n")
    listed = read_known_failures(path, known_failures.known_names(["matches_oracle-a:b.json"]))
    assert {name: e.reason for name, e in listed.items()} == {
        "matches_oracle-a:b.json": "a case named with a colon",
        "padding": "slot ids: not -1",
    }


@pytest.mark.parametrize(("value", "message"), [
    pytest.param("", "*c128a: --c128a-cases='' names no folder; name a folder of *.json cases*",
                 id="empty"),
    pytest.param("a-file.json", "*c128a: --c128a-cases=a-file.json: */a-file.json is not a "
                                "folder; name the folder that holds the *.json cases*", id="file"),
])
def test_a_cases_option_that_names_no_folder_is_a_usage_error(
    pytester, value, message, c128a_device
):
    pytester.path.joinpath("a-file.json").write_text("{}")
    result = pytester.runpytest(*REGRESSIONS, device(c128a_device), "--c128a-cases", value, "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.slow
def test_collecting_leaves_no_hypothesis_folder_behind(pytester):
    result = pytester.runpytest_subprocess("--pyargs", "c128a.conformance.test_width_policy",
                                           "--c128a-device=cpu", "-p", "no:cacheprovider", "--co")
    assert result.ret == pytest.ExitCode.OK
    assert not (pytester.path / ".hypothesis").exists()


def test_checks_of_the_project_s_own_code_are_deselected_for_other_targets(pytester, c128a_device):
    """Not skipped (a skip is a check that did not run): the project's own
    bad-input checks, and the VLLM_BATCH_INVARIANT check of the project's
    policy, are not checks of a target that brings its own policy."""
    from c128a.checks import BAD_INPUTS

    own = [case.name for case in BAD_INPUTS if not case.contract]
    selection = ("--pyargs", "c128a.conformance.test_bad_input",
                 "c128a.conformance.test_width_policy", device(c128a_device), "--co", "-q",
                 "-p", "no:cacheprovider")
    everything = pytester.runpytest(*selection, "--c128a-target=reference")
    other = pytester.runpytest(*selection, f"--c128a-target={POLICY_MUTANT}")
    assert own and everything.ret == other.ret == pytest.ExitCode.OK
    listed = other.stdout.str()
    assert "test_batch_invariant_mode_follows_environment" in everything.stdout.str()
    assert "test_batch_invariant_mode_follows_environment" not in listed
    assert not [name for name in own if f"test_rejects[{name}]" in listed]
    assert all(f"test_rejects[{case.name}]" in listed for case in BAD_INPUTS if case.contract)
    total = len(everything.stdout.lines) - 2  # less the blank line and the count
    other.stdout.fnmatch_lines([f"{total - len(own) - 1}/{total} tests collected "
                                f"({len(own) + 1} deselected)*"])


# ---------------------------------------------------------------- a not-run check the team accepts


def test_a_not_run_line_is_read_apart_from_a_known_failure(tmp_path):
    path = tmp_path / "known.txt"
    path.write_text("padding: slot ids, not -1\nnot run: consumers: 0.30.0 lacks combine_swa\n")
    listed = read_known_failures(path, NAMES)
    assert [(e.name, e.reason, e.not_run) for e in listed.values()] == [
        ("padding", "slot ids, not -1", False), ("consumers", "0.30.0 lacks combine_swa", True)]


ACCEPTED_CHECKS = """
import pytest

@pytest.mark.conformance("views")
def test_passes():
    pass

@pytest.mark.conformance("consumers")
@pytest.mark.parametrize("name", ["global_topk", "combine_swa"])
def test_has_consumer(name):
    if name == "combine_swa":
        pytest.skip("consumer combine_swa unavailable: this release lacks it")
"""


@pytest.mark.parametrize("line, green", [
    pytest.param("not run: consumers: this release lacks combine_swa", True, id="accepted"),
    pytest.param("not run: views: we thought it could not run", False, id="stale"),
])
def test_a_not_run_line_accepts_what_does_not_run_and_goes_stale_when_all_runs(
    pytester, runpytest_on_the_cpu, line, green
):
    # Before: the only way to green was --c128a-allow-not-run, which allows every not-run check.
    pytester.makepyfile(test_accepted=ACCEPTED_CHECKS)
    pytester.path.joinpath("known.txt").write_text(line + "\n")
    result = runpytest_on_the_cpu("--c128a-target=reference", "-p", "no:randomly",
                                  "-p", "no:cacheprovider", "--c128a-known-failures", "known.txt")
    if green:
        assert result.ret == pytest.ExitCode.OK
        result.stdout.fnmatch_lines([
            "c128a known failures (known.txt): 0 listed, 0 failed as expected, 0 passed (stale), "
            "0 not run; 1 accepted not to run",
            "c128a conformance: 2 checks ran: 2 passed, 0 failed, 0 expected failures; 1 not run "
            "(other reasons: 1)",
            "  not run: test_accepted.py::test_has_consumer[[]combine_swa] (consumers): consumer "
            "combine_swa unavailable: this release lacks it [[]accepted by known.txt:1 (this "
            "release lacks combine_swa)]",
        ])
        return
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*known.txt:1 accepts that 'views' does not run (we thought it could not run), but it "
        "ran: 1 test(s) ran and none did not. Remove the line.",
        # The not-run check no line accepts now fails the run too.
        "FAILED c128a::not_run - 1 check(s) of the target did not run*",
        "FAILED known.txt::views - known.txt:1 accepts that 'views' does not run*",
    ])


# ---------------------------------------------------------------- a check that hangs

HANGING_TARGET = """
import ctypes

from c128a.contract import oracle


def build_c128a_topk_metadata(*args):
    ctypes.CDLL(None).sleep(3600)  # in native code: no Python signal handler runs there
    return oracle.build_c128a_topk_metadata(*args)
"""


@pytest.mark.slow
def test_a_hanging_check_ends_the_run_red_naming_it_wherever_it_runs(pytester):
    # Before: from a folder without this repository's ini file (a kernel's own
    # repository), no timeout at all: the run hung for ever.
    pytester.makepyfile(hanging_target=HANGING_TARGET)
    started = time.monotonic()
    result = pytester.runpytest_subprocess(
        "--pyargs", "c128a.conformance.test_properties", "--c128a-device=cpu",
        "--c128a-target=hanging_target", "-k", "test_property and views", "-p", "no:randomly",
        "-p", "no:cacheprovider", "--c128a-check-timeout=3", timeout=300)
    assert time.monotonic() - started < 120
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["c128a check timeout: 3 s a check (from --c128a-check-timeout)*"])
    result.stderr.fnmatch_lines([
        "*in build_c128a_topk_metadata*",  # the stacks, where it hangs
        "c128a: check test_properties.py::test_property[[]views] (views) ran past its time limit "
        "of 3 s (from --c128a-check-timeout; --c128a-check-timeout or $C128A_CHECK_TIMEOUT sets "
        "it): its process ends here, stacks above; a check that does not finish is not a pass",
    ])


@pytest.mark.parametrize("given, line", [
    pytest.param([], "c128a check timeout: 900 s a check (from default)*", id="default"),
    pytest.param(["--timeout=42"], "c128a check timeout: 72 s a check (from pytest-timeout's "
                 "--timeout 42 s, plus 30 s for its own method to act first)*",
                 id="pytest-timeout"),
    pytest.param(["--timeout=42", "--c128a-check-timeout=7"], "c128a check timeout: 7 s a check "
                 "(from --c128a-check-timeout)*", id="own-option-wins"),
    pytest.param(["--c128a-check-timeout=0"], "c128a check timeout: none (from "
                 "--c128a-check-timeout)", id="none"),
])
def test_the_check_timeout_does_not_shadow_a_users_timeout(pytester, c128a_device, monkeypatch,
                                                           given, line):
    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    monkeypatch.delenv("C128A_CHECK_TIMEOUT", raising=False)
    result = pytester.runpytest(*REGRESSIONS, device(c128a_device), "--co", *given)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([line])


def test_a_check_timeout_that_is_no_number_is_a_usage_error(pytester, c128a_device, monkeypatch):
    monkeypatch.setenv("C128A_CHECK_TIMEOUT", "soon")
    result = pytester.runpytest(*REGRESSIONS, device(c128a_device), "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: c128a: $C128A_CHECK_TIMEOUT='soon' is not a number of "
                                 "seconds; give one (0: no limit)"])
