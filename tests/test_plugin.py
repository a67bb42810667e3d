"""The pytest plugin, exercised through pytester like pytest's own plugins."""

import pytest

from c128a.plugin.pytest_plugin import header_lines

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

PROBE = """
def test_probe(c128a_target, c128a_device):
    print("TARGET", c128a_target.spec, "DEVICE", c128a_device)
"""


def test_header_lines_are_key_value():
    lines = header_lines("triton", "default", "cpu", True, "ci", None)
    assert lines == [
        "c128a target: triton (from default)",
        "c128a device: cpu (Triton interpreter)",
        "c128a hypothesis profile: ci",
    ]


def test_header_says_why_a_target_is_unavailable():
    (line, *_) = header_lines("vllm", "$C128A_TARGET", "cuda", False, "gpu", "No module named 'vllm'")
    assert "UNAVAILABLE" in line and "No module named 'vllm'" in line


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


@pytest.mark.slow
def test_unavailable_vllm_skips_with_the_import_error(pytester):
    pytester.makepyfile(PROBE)
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "--c128a-target=vllm", "-rs")
    result.stdout.fnmatch_lines(["*SKIPPED*target 'vllm' unavailable*No module named*"])
    result.assert_outcomes(skipped=1)


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
