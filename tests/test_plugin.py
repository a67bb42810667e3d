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
