"""The conformance suite as a kernel team runs it: a wheel of this checkout
installed in a fresh virtual environment, ``pytest --pyargs
c128a.conformance`` run from an empty folder outside the checkout.

To stay quick, the fresh environment installs c128a alone (``--no-deps``,
from a wheel built with ``pip wheel --no-deps``) and sees this environment's
packages (torch, Triton, Hypothesis, pytest) through a ``.pth`` file placed
after its own site-packages; c128a itself is imported from the fresh install,
never the checkout (asserted). Marked ``installed`` (``-m "not installed"``
leaves it out).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from c128a import cases
from c128a.cases import load_case
from c128a.conformance import KEPT_CASES

pytestmark = [pytest.mark.installed, pytest.mark.slow]

CHECKOUT = Path(__file__).resolve().parents[1]
PACKED = "c128a.mutants:packed_stride"
# The whole package suite but the long checks (the serving loop's state
# machine; the sanitizer and recompile checks skip without a GPU anyway), with
# --strict-markers: the plugin registers every marker the package uses.
# On the CPU whatever the machine: what a mutant fails depends on the device
# (a real CUDA graph catches packed_stride in consumers_replay too).
# The reference and packed_stride declare no keyed launcher: their
# compile-key checks are not applicable (named in the summary), so no check
# that applies is left not run, and no --c128a-allow-not-run is needed.
SELECTION = ["-m", "not slow", "--hypothesis-profile=ci", "--strict-markers",
             "--c128a-device=cpu"]
# What packed_stride fails in that selection: the kill matrix's row, the
# steps into one set of buffers, the replay and the two kept cases found on it.
PACKED_FAILS = {
    "matches_oracle": "rows written at stride W, read at the buffers' stride C",
    "adaptive_equals_full": "the same rows, compared at W and at C",
    "views": "the views' row stride is W, not C",
    "untouched_memory": "the packed rows' tails overwrite other rows",
    "padding": "padding columns land in the wrong rows",
    "independent": "a token's row depends on the others",
    "other_geometries": "the one-build checks at other R and B",
    "history_independent": "the same rows over earlier contents",
    "persistent_buffers": "steps into one set of buffers",
    "replay": "the captured consumer reads stale bytes from decode row 1",
    "consumers_replay": "the decode consumer captured at W = C reads the packed rows at stride C",
    "matches_oracle-b839eb151f69.json": "the kept case found on this mutant",
    "serving_loop-eb72c0efdf9f.json": "the kept case the serving loop found on it",
}


def _packed_fails() -> dict[str, str]:
    """PACKED_FAILS less the kept cases this Hypothesis cannot replay (one
    with neither concrete inputs nor recorded steps replays from its blob,
    only under the version that wrote it; such a case is skipped with the
    reason, so it fails nothing here)."""
    return {name: reason for name, reason in PACKED_FAILS.items()
            if not name.endswith(".json") or _replayable_here(load_case(KEPT_CASES / name))}


def _replayable_here(case) -> bool:
    return not cases.needs_its_blob(case) or cases.blob_problem(case) is None


def _run(command, **options) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, **options)


@pytest.fixture
def installed(tmp_path):
    """(python of a fresh venv with this checkout's wheel installed, the
    environment to run it in, an empty folder outside the checkout)."""
    root = tmp_path
    source = root / "source"  # a copy: building in the checkout would leave build/ there
    shutil.copytree(CHECKOUT / "c128a", source / "c128a",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(CHECKOUT / name, source / name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER",
                        "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST")
           and not k.startswith("C128A_")}
    wheels = root / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--no-index", "-q", "-w", str(wheels), str(source)], env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("c128a-*.whl")

    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    done = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                 "--no-index", "-q", str(wheel)], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    fresh = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      env=env).stdout.strip())
    (fresh / "zz_c128a_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    # The runs' own pytest temporary folders, apart from this run's.
    env["TMPDIR"] = str(root / "tmp")
    (root / "tmp").mkdir()
    empty = root / "kernel-repo"
    empty.mkdir()
    where = _run([str(python), "-c", "import c128a; print(c128a.__file__)"], env=env, cwd=empty)
    assert Path(where.stdout.strip()).is_relative_to(fresh), where.stdout + where.stderr
    return python, env, empty, fresh


def _pytest(installed, *args) -> subprocess.CompletedProcess:
    python, env, folder, _ = installed
    return _run([str(python), "-m", "pytest", "--pyargs", "c128a.conformance", *SELECTION, *args],
                cwd=folder, env=env, timeout=600)


def _known_failures(folder: Path, entries: dict[str, str]) -> str:
    path = folder / "known-failures.txt"
    path.write_text("# what packed_stride is known to fail\n"
                    + "".join(f"{name}: {reason}\n" for name, reason in entries.items()))
    return path.name


def _the_reference_passes_with_header_scheduling_and_kept_cases(installed):
    _, _, folder, fresh = installed
    done = _pytest(installed, "--c128a-target=reference", "-n", "2")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for line in ("c128a target: reference (from --c128a-target)",
                 "c128a hypothesis profile: ci",
                 "c128a regression cases: 3 in the package",
                 "c128a xdist scheduling: longest first"):
        assert line in out, line
    # What did not run, counted and named: CUDA's checks; and, apart, the
    # compile keys the reference cannot have (before: not run, allowed).
    assert re.search(r"c128a conformance: \d+ checks ran: \d+ passed, 0 failed, \d+ expected "
                     r"failures; \d+ not run \(CUDA: \d+\); \d+ not applicable", out), out
    assert ("  not applicable (the target declares no keyed launcher (launchers): it has no "
            "compile keys): compile_keys (2 tests)") in out, out
    # The durations the scheduling reads next time: in the folder pytest ran in.
    assert (folder / ".pytest_cache" / "v" / "c128a" / "durations").is_file()
    assert not (fresh / ".pytest_cache").exists() and not (fresh / "c128a" / ".pytest_cache").exists()


def _a_mutant_fails_with_the_invariant_and_its_diff(installed):
    done = _pytest(installed, f"--c128a-target={PACKED}", "-n", "2")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "[matches_oracle] prefill_buffer row" in out or "[matches_oracle] global_decode" in out
    assert "expected [" in out and "actual   [" in out
    assert "rerun: c128a replay " in out and "matches_oracle-b839eb151f69.json" in out
    assert "case file: " in out  # a property's failing step, saved
    failed = [line for line in out.splitlines() if line.startswith("FAILED ")]
    assert len(failed) >= len(_packed_fails()), out


def _known_failures_turn_the_mutant_green(installed):
    _, _, folder, _ = installed
    fails = _packed_fails()
    name = _known_failures(folder, fails)
    done = _pytest(installed, f"--c128a-target={PACKED}", "--c128a-known-failures", name)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "xfailed" in out
    assert f"{len(fails)} listed, {len(fails)} failed as expected, 0 passed" in out


def _a_known_failure_that_passes_fails_the_run(installed):
    _, _, folder, _ = installed
    fails = _packed_fails()
    name = _known_failures(folder, {**fails, "width_policy": "not a failure at all"})
    # Only the check in question runs: a listed check left out by -k is not judged.
    done = _pytest(installed, f"--c128a-target={PACKED}", "--c128a-known-failures", name,
                   "-k", "width_policy")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert f"{name}:{len(fails) + 2} lists 'width_policy' as a known failure" in out
    assert "Remove the line." in out


def test_the_installed_suite_from_an_empty_folder(installed):
    """One test, so that one worker builds the environment once and the
    four runs do not compete for the cores."""
    _the_reference_passes_with_header_scheduling_and_kept_cases(installed)
    _a_mutant_fails_with_the_invariant_and_its_diff(installed)
    _known_failures_turn_the_mutant_green(installed)
    _a_known_failure_that_passes_fails_the_run(installed)
