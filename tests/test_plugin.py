"""The pytest plugin, exercised through pytester like pytest's own plugins."""

import importlib.util
import os
import zipfile
from fnmatch import fnmatch

import pytest

from c128a.plugin.pytest_plugin import header_lines, load_target_or_refuse

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

PROBE = """
def test_probe(c128a_target, c128a_device):
    print("TARGET", c128a_target.spec, "DEVICE", c128a_device)
"""


def test_header_lines_are_key_value():
    lines = header_lines("triton", "default", "cpu", True, "ci")
    assert lines == [
        "c128a target: triton (from default)",
        "c128a device: cpu (Triton interpreter)",
        "c128a hypothesis profile: ci",
    ]


def _vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def test_a_target_that_does_not_load_is_refused_in_one_line_naming_it():
    if _vllm_importable():
        pytest.skip("vLLM is importable here; the refusal cannot be shown")
    with pytest.raises(pytest.UsageError) as refused:
        load_target_or_refuse("vllm", "$C128A_TARGET", None)
    message = str(refused.value)
    assert message.startswith("c128a: target 'vllm' (from $C128A_TARGET) does not load, so the "
                              "run would check nothing: vllm target not importable")
    assert "\n" not in message


@pytest.mark.slow
def test_option_beats_environment_in_header(pytester, monkeypatch):
    monkeypatch.setenv("C128A_TARGET", "triton")
    pytester.makepyfile(PROBE)
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "--c128a-target=reference", "-s")
    result.stdout.fnmatch_lines(
        ["c128a target: reference (from --c128a-target)", "c128a device: cpu*", "*TARGET reference*"]
    )
    assert result.ret == 0


@pytest.mark.slow
def test_environment_target_in_header(pytester, monkeypatch):
    monkeypatch.setenv("C128A_TARGET", "reference")
    pytester.makepyfile(PROBE)
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "-s")
    result.stdout.fnmatch_lines(["c128a target: reference (from $C128A_TARGET)"])
    assert result.ret == 0


@pytest.mark.slow
def test_bad_target_is_a_usage_error(pytester):
    pytester.makepyfile(PROBE)
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "--c128a-target=no_such_mod:x")
    result.stderr.fnmatch_lines(["*c128a: target spec 'no_such_mod:x': cannot import module*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def _offline_pip(pytester, monkeypatch) -> None:
    """pip sees no index, only an empty --find-links folder; the cache is empty."""
    links = pytester.mkdir("links")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("C128A_CACHE", str(pytester.mkdir("cache")))


def _wheel_without_the_builder(pytester) -> str:
    wheel = pytester.path / "vllm-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/other.py", "X = 1\n")
    return str(wheel)


@pytest.mark.slow
@pytest.mark.parametrize(("source", "xdist", "why"), [
    pytest.param("vllm", [], "*vllm target not importable*", id="vllm"),
    pytest.param("a version no index has", ["-n", "2"],
                 "*vLLM 0.0.2: the package index has no vllm 0.0.2*", id="no-such-version-n2"),
    pytest.param("a wheel that does not extract", [],
                 "*vLLM 0.0.1: no file of vllm-0.0.1-*.whl defines*", id="bad-wheel"),
])
def test_a_target_that_does_not_load_stops_the_run_in_one_line(pytester, monkeypatch, source,
                                                               xdist, why):
    # The conformance suite against a target it cannot load once passed 1
    # and skipped 112, exit 0: a run that checked nothing.
    if source == "vllm" and _vllm_importable():
        pytest.skip("vLLM is importable here; the refusal cannot be shown")
    _offline_pip(pytester, monkeypatch)
    spec = {"vllm": "vllm", "a version no index has": "vllm-release:0.0.2",
            "a wheel that does not extract": f"vllm-release:{_wheel_without_the_builder(pytester)}"}
    result = pytester.runpytest_subprocess(
        "--pyargs", "c128a.conformance.test_regressions", "--c128a-device=cpu",
        f"--c128a-target={spec[source]}", "-p", "no:randomly", *xdist,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    refusals = [line for line in result.stderr.lines if "c128a:" in line]
    assert len(refusals) == 1, result.stderr.lines  # once, by the controller, not per worker
    assert fnmatch(refusals[0], f"ERROR: c128a: target '{spec[source]}' (from "
                                    f"--c128a-target) does not load, so the run would check "
                                    f"nothing: {why}")
    assert "passed" not in result.stdout.str() and "skipped" not in result.stdout.str()


@pytest.mark.slow
def test_cuda_marker_skips_on_cpu_with_reason(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cuda
        def test_gpu_only():
            raise AssertionError("must not run on the CPU")
        """
    )
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "-rs")
    result.stdout.fnmatch_lines(["*SKIPPED*needs CUDA*"])
    result.assert_outcomes(skipped=1)


@pytest.mark.slow
def test_ci_environment_selects_ci_profile(pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(
        """
        from hypothesis import settings

        def test_profile():
            assert settings.get_current_profile_name() == "ci"
            assert settings.default.derandomize
        """
    )
    result = pytester.runpytest_subprocess("--c128a-device=cpu")
    result.stdout.fnmatch_lines(["c128a hypothesis profile: ci"])
    assert result.ret == 0


@pytest.mark.slow
def test_explicit_profile_wins(pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(
        """
        from hypothesis import settings

        def test_profile():
            assert settings.get_current_profile_name() == "fuzz"
        """
    )
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "--hypothesis-profile=fuzz")
    result.stdout.fnmatch_lines(["c128a hypothesis profile: fuzz"])
    assert result.ret == 0


@pytest.mark.slow
def test_cuda_device_without_gpu_is_a_usage_error(pytester):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present; the refusal cannot be shown")
    pytester.makepyfile(PROBE)
    result = pytester.runpytest_subprocess("--c128a-device=cuda")
    result.stderr.fnmatch_lines(["*c128a: device='cuda' but torch.cuda.is_available() is False*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


# ---------------------------------------------------------------- targets that do not load, in one line


def _device_option(c128a_device) -> str:
    """The option for a run in this process: the session's device (a CUDA
    session refuses the CPU once its kernels are imported)."""
    return f"--c128a-device={c128a_device.type}"


NOT_LOADING = {
    "importorskip": ("import pytest\npytest.importorskip('no_such_module_c128a_test')\n",
                     "*importing module 'not_loading' raised Skipped: could not import "
                     "'no_such_module_c128a_test'*"),
    "own-base-exception": ("class Stop(BaseException):\n    pass\nraise Stop('stopped')\n",
                           "*importing module 'not_loading' raised Stop: stopped*"),
    "os-exit": ("import os\nos._exit(0)\n",
                "*importing module 'not_loading' raised ExitCalled: os._exit(0) called during "
                "the import of target 'not_loading', before the run finished*"),
    "wrong-declaration": ("from c128a.contract.oracle import build_c128a_topk_metadata\n"
                          "def my_kernel():\n    pass\njit_functions = my_kernel\n",
                          "*target 'not_loading': jit_functions = <function my_kernel*> (type "
                          "function); it must be a tuple or list*"),
}


@pytest.mark.parametrize("kind", NOT_LOADING)
def test_a_module_that_raises_exits_or_declares_badly_stops_the_run_in_one_line(
    pytester, monkeypatch, c128a_device, kind
):
    # Before: INTERNALERROR and a traceback (exit 3), or, for os._exit(0)
    # while imported, exit 0 and no output: a run that checked nothing, green.
    source, line = NOT_LOADING[kind]
    pytester.makepyfile(not_loading=source)
    monkeypatch.syspath_prepend(str(pytester.path))
    result = pytester.runpytest("--pyargs", "c128a.conformance", _device_option(c128a_device),
                                "--c128a-target=not_loading", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    refusals = [text for text in result.stderr.lines if "c128a:" in text]
    assert len(refusals) == 1, result.stderr.lines
    assert fnmatch(refusals[0], "ERROR: c128a: " + line), refusals[0]
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


@pytest.mark.parametrize("how", ["option", "environment"])
def test_an_empty_target_spec_stops_the_run_in_one_line(pytester, monkeypatch, c128a_device, how):
    # Before: --c128a-target=$SPEC with $SPEC unset tested triton, the default, and passed.
    pytester.makepyfile(PROBE)
    if how == "option":
        monkeypatch.delenv("C128A_TARGET", raising=False)
        result = pytester.runpytest(_device_option(c128a_device), "--c128a-target=")
        origin = "--c128a-target"
    else:
        monkeypatch.setenv("C128A_TARGET", "")
        result = pytester.runpytest(_device_option(c128a_device))
        origin = "$C128A_TARGET"
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: c128a: {origin}='' names no target *"])
    assert "TARGET" not in result.stdout.str()  # the probe never ran


@pytest.mark.slow
def test_a_target_module_raising_keyboard_interrupt_stops_the_run_in_one_line(pytester):
    # Before: exit 2 and nothing said. (In a child: pytester's in-process run
    # cannot take an interruption before the session starts.)
    pytester.makepyfile(interrupting="raise KeyboardInterrupt\n")
    result = pytester.runpytest_subprocess("--pyargs", "c128a.conformance", "--c128a-device=cpu",
                                           "--c128a-target=interrupting")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stderr.fnmatch_lines([
        "Exit: c128a: interrupted while importing target 'interrupting' (from --c128a-target): "
        "KeyboardInterrupt (Ctrl-C, or the module raised it); nothing ran",
    ])


def test_an_unknown_hypothesis_profile_is_one_usage_line(pytester, c128a_device):
    # Before: INTERNALERROR with Hypothesis's traceback.
    pytester.makepyfile(PROBE)
    result = pytester.runpytest(_device_option(c128a_device), "--hypothesis-profile=nonexistent")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: c128a: --hypothesis-profile='nonexistent' names no registered Hypothesis "
        "profile; c128a registers ci, dev, fuzz, gpu (c128a/checks/profiles.py), Hypothesis "
        "'default'; a conftest.py may register others (settings.register_profile)",
    ])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


# ---------------------------------------------------------------- code that ends the process

ENDING_TARGET = """
import ctypes
import os

from c128a.contract import oracle

HOW, WHEN = os.environ["C128A_TEST_ENDING"].split(":")


def _end():
    if HOW == "os._exit":
        os._exit(0)
    ctypes.CDLL(None).exit(0)  # a native library calling exit(0)


if WHEN == "import":
    _end()


def build_c128a_topk_metadata(*args):
    _end()
    return oracle.build_c128a_topk_metadata(*args)
"""
ENDING_CHECK = """
import pytest

from c128a.step import build
from c128a.strategies import HISTORICAL_BATCHES


@pytest.mark.conformance("matches_oracle")
def test_builds(c128a_target, c128a_device):
    build(c128a_target, HISTORICAL_BATCHES["upstream_two_decode_two_prefill"], c128a_device)
"""


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [[], ["-n", "1"]], ids=["plain", "n1"])
@pytest.mark.parametrize("how, when", [
    ("os._exit", "build"), ("exit", "import"), ("exit", "build"),
])
def test_code_ending_the_process_ends_the_run_red_in_one_line(pytester, monkeypatch, how, when,
                                                              xdist):
    # Before: exit 0 and no output, a run that checked nothing read as a pass.
    # (os._exit at import: test_a_module_that_raises_exits_or_declares_badly_...)
    pytester.makepyfile(ending_target=ENDING_TARGET, test_checks=ENDING_CHECK)
    monkeypatch.setenv("C128A_TEST_ENDING", f"{how}:{when}")
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "--c128a-target=ending_target",
                                           "-p", "no:cacheprovider", "-p", "no:randomly",
                                           "test_checks.py", *xdist, timeout=180)
    output = result.stdout.str() + result.stderr.str()
    said = [line for line in output.splitlines() if "c128a: the process called exit()" in line]
    if when == "import":
        assert result.ret == pytest.ExitCode.USAGE_ERROR, output
        assert len(said) == 1 and "during the import of target 'ending_target', before the "
        "pytest run finished" in said[0], output
        assert "passed" not in output
        return
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    if how == "os._exit":  # refused where it was called: the target's failure
        result.stdout.fnmatch_lines([
            "*TargetRaised: [[]target_raised] the target's build_c128a_topk_metadata raised "
            "ExitCalled: os._exit(0) called during test test_checks.py::test_builds, before the "
            "run finished*",
            "c128a conformance: 1 checks ran: 0 passed, 1 failed, 0 expected failures; 0 not run",
        ])
        return
    assert len(said) == 1 and "during test test_checks.py::test_builds, before the pytest run "
    "finished: the pytest run did not finish, so it is not a pass (exit status 1)" in said[0], (
        output)
    if xdist:  # the worker died: the controller counts its check failed, never passed
        result.stdout.fnmatch_lines([
            "c128a conformance: 1 checks ran: 0 passed, 1 failed, 0 expected failures; 0 not run",
            "  crashed: test_checks.py::test_builds (matches_oracle): the worker running it "
            "died; it did not pass",
        ])
