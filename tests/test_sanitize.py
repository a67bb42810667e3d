"""``c128a sanitize``: builds under compute-sanitizer's memcheck and initcheck.

On the CPU, a stand-in sanitizer (``tests/stand_in_sanitizer.py``) runs the
real child on the interpreter and reports where told to, which tests the
plumbing: markers, attribution of each report to its step, the table in
which only readable entries are written, saved cases and replay. On a GPU
with ``compute-sanitizer`` the real tools run: the project's kernel comes out
clean (the selected target: :mod:`c128a.conformance.test_sanitizer`), and a
kernel reading one table entry past n(t) is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from c128a import cases, cli
from c128a.contract import INERT, SLOTS
from c128a.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from c128a.gpu import compute_sanitizer
from c128a.strategies import HISTORICAL_BATCHES

HERE = Path(__file__).parent
STALE = HISTORICAL_BATCHES["stale_padding_past_its_request"]
PAST_ONE_ENTRY = "c128a.kernels.mutants:reads_one_entry_past"


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """An executable stand-in for compute-sanitizer."""
    program = tmp_path / "compute-sanitizer"
    program.write_text(f"#!{sys.executable}\n" + (HERE / "stand_in_sanitizer.py").read_text())
    program.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE.parent), *sys.path]))
    return str(program)


def _sanitizer_here() -> str | None:
    try:
        return compute_sanitizer.find_sanitizer()
    except compute_sanitizer.SanitizerUnavailable:
        return None


# ---------------------------------------------------------------- what may be read


def test_readable_pages_follow_n_t_and_the_variant():
    # Tokens: request 0 at 388 (3 entries: 2 pages), request 1 at 2559
    # (19 entries: 10 pages), padding of request 0 at 2916 (22 entries: 11 pages).
    assert compute_sanitizer.readable_pages(STALE, STALE.width, SLOTS) == {0: 11, 1: 10}
    assert compute_sanitizer.readable_pages(STALE, STALE.width, INERT) == {0: 2, 1: 10}
    # At W = 128 nothing changes here; at W = 2 lists are cut to 1 page.
    assert compute_sanitizer.readable_pages(STALE, 2, SLOTS) == {0: 1, 1: 1}


def test_parse_output_gives_each_report_to_the_build_before_it():
    steps = [{"index": i, "name": f"s{i}", "width": 128, "batch": {"i": i}} for i in range(3)]
    lines = ["========= COMPUTE-SANITIZER"]
    for step in steps:
        lines.append(f"{compute_sanitizer.MARKER} step {json.dumps(step)}")
        if step["index"] == 1:
            lines += ["========= Uninitialized __global__ memory read of size 4 bytes",
                      "=========     at reads_one_entry_past_kernel+0x90",
                      "========="]
    lines += [f"{compute_sanitizer.MARKER} done {{}}", "========= ERROR SUMMARY: 1 error"]
    run = compute_sanitizer.parse_output("initcheck", [], compute_sanitizer.ERROR_EXIT, lines)
    assert run.steps == 3 and not run.errors and run.finished
    [finding] = run.findings
    assert (finding.index, finding.name, finding.kind) == (1, "s1", "initcheck")
    assert finding.headline == "Uninitialized __global__ memory read of size 4 bytes"
    assert "reads_one_entry_past_kernel" in finding.report
    assert run.summary == "ERROR SUMMARY: 1 error"


def test_parse_output_calls_an_unexplained_exit_an_error():
    run = compute_sanitizer.parse_output("memcheck", [], 1, ["Traceback (most recent call last):",
                                                     "ImportError: no"])
    assert run.errors and "exited 1" in run.errors[0] and "ImportError" in run.errors[0]
    assert not run.clean


# ---------------------------------------------------------------- the plumbing, on the CPU


@pytest.mark.slow
def test_a_clean_run_builds_every_step_at_both_widths(stand_in, c128a_device):
    run = compute_sanitizer.run_sanitizer("memcheck", "triton", batches=[STALE.to_json()], examples=3,
                                  sanitizer=stand_in, device=c128a_device.type)
    assert run.clean and run.finished, run.errors or run.findings
    # The case's step and 3 drawn ones, each at W and at C (W < C for all here or one width).
    assert 4 <= run.steps <= 8 and run.summary == "ERROR SUMMARY: 0 errors"


@pytest.mark.slow
def test_a_report_becomes_a_finding_of_its_step(stand_in, monkeypatch, c128a_device):
    monkeypatch.setenv("STAND_IN_REPORT_AT", "1")
    run = compute_sanitizer.run_sanitizer("memcheck", "triton", batches=[STALE.to_json()],
                                  sanitizer=stand_in, device=c128a_device.type)
    [finding] = run.findings
    assert finding.index == 1 and finding.width == STALE.capacity and finding.name == "case 0"
    assert finding.batch["positions"] == list(STALE.positions)
    assert not run.errors


@pytest.mark.slow
def test_a_wrong_value_is_a_finding_too(stand_in, c128a_device):
    run = compute_sanitizer.run_sanitizer("initcheck", "c128a.mutants:negative_pages_as_sentinel",
                                  batches=[STALE.to_json()], sanitizer=stand_in,
                                  device=c128a_device.type)
    assert run.findings and {f.kind for f in run.findings} == {compute_sanitizer.VALUES}
    assert "[matches_oracle] global_decode_buffer row 2" in run.findings[0].report


def test_a_missing_sanitizer_is_a_usage_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(compute_sanitizer.SANITIZER_ENV, str(tmp_path / "nothing"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(compute_sanitizer, "SANITIZER_FALLBACKS", ())
    assert cli.main(["sanitize"]) == EXIT_USAGE
    assert "compute-sanitizer not found" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's refusal: a GPU is here")
def test_sanitize_without_a_gpu_is_a_usage_error(stand_in, capsys):
    assert cli.main(["sanitize", "--sanitizer", stand_in]) == EXIT_USAGE
    assert "needs a GPU" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1"])
def test_bad_examples_are_refused(stand_in, capsys, value):
    assert cli.main(["sanitize", "--sanitizer", stand_in, "--examples", value]) == EXIT_USAGE
    assert "--examples=-1 must be >= 0" in capsys.readouterr().err


def test_a_sanitizer_case_replays_only_on_a_gpu(tmp_path, c128a_device):
    case = cases.new_case(property="sanitizer_initcheck", target="triton", kind="failure",
                          failure="initcheck: Uninitialized __global__ memory read",
                          batch=STALE, device="cuda", sanitizer_report="=========  ...")
    path, _ = cases.write_case(case, tmp_path)
    loaded = cases.load_case(path)
    assert loaded.sanitizer_report == "=========  ..." and loaded.property in compute_sanitizer.PROPERTIES
    if c128a_device.type != "cuda":
        from c128a.targets import load_target

        outcome = cases.replay_case(loaded, load_target("triton"), c128a_device)
        assert outcome.verdict == cases.CANNOT_REPLAY and "GPU only" in outcome.report


# ---------------------------------------------------------------- the real tools (GPU)


def _sanitize(tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "c128a.cli", "sanitize", "--cases-dir", str(tmp_path), *args],
        capture_output=True, text=True, timeout=1800,
    )


# One tool per test, and the replay apart from the run that saved the case:
# each is a child process under the tool, and side by side they take the time
# of the longest.
@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(_sanitizer_here() is None, reason="compute-sanitizer not installed")
@pytest.mark.parametrize("tool", compute_sanitizer.TOOLS)
def test_the_inert_kernel_is_clean_under_both_tools(tool, tmp_path):
    # The selected target (triton by default) runs under both tools in
    # c128a/conformance/test_sanitizer.py; this is the kernel's other variant.
    done = _sanitize(tmp_path, "--target", "triton-inert", "--tool", tool, "--examples", "10")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert f"{tool}: clean" in done.stdout
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(_sanitizer_here() is None, reason="compute-sanitizer not installed")
def test_reading_one_entry_past_n_t_is_reported_and_saved(tmp_path):
    done = _sanitize(tmp_path, "--target", PAST_ONE_ENTRY, "--tool", "initcheck",
                     "--examples", "0")
    assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
    assert "initcheck: FOUND" in done.stdout
    assert "Uninitialized __global__ memory read" in done.stdout
    saved = sorted(tmp_path.glob("sanitizer_initcheck-*.json"))
    assert saved
    case = cases.load_case(saved[0])
    assert "reads_one_entry_past_kernel" in case.sanitizer_report
    assert case.batch is not None and case.property == "sanitizer_initcheck"


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(_sanitizer_here() is None, reason="compute-sanitizer not installed")
def test_a_saved_sanitizer_case_replays_under_its_tool(tmp_path):
    """A case as the test above saves one, for one step: replayed, the step
    is built again under initcheck, which reports the read again."""
    case = cases.new_case(property="sanitizer_initcheck", target=PAST_ONE_ENTRY, kind="failure",
                          failure="initcheck: Uninitialized __global__ memory read",
                          batch=STALE, device="cuda", sanitizer_report="=========  ...")
    path, _ = cases.write_case(case, tmp_path)
    replay = subprocess.run([sys.executable, "-m", "c128a.cli", "replay", str(path)],
                            capture_output=True, text=True, timeout=900)
    assert replay.returncode == EXIT_FAILED, replay.stdout + replay.stderr
    assert "STILL FAILS" in replay.stdout


def test_a_child_past_the_time_limit_is_killed_and_reported(stand_in, tmp_path, c128a_device):
    slow = tmp_path / "slow-sanitizer"
    slow.write_text(f"#!{sys.executable}\nimport time\nprint('========= COMPUTE-SANITIZER', "
                    "flush=True)\ntime.sleep(60)\n")
    slow.chmod(0o755)
    run = compute_sanitizer.run_sanitizer("memcheck", "triton", sanitizer=str(slow), timeout=2,
                                  device=c128a_device.type)
    assert any("ran past 2 s and was killed" in e for e in run.errors), run.errors
    assert not run.clean
