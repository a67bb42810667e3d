"""The fuzz runner under real faults: signals, a dead parent, slow failures,
lost disks, unwritable paths, racing runs. Nothing found may be lost.

Every run here is a real ``c128a fuzz`` with real worker processes; the ones
that take a signal run as a child process in its own session, so a signal to
its process group reaches nobody else. Processes are followed through
``/proc`` (Linux).
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from c128a import cases, cli
from c128a.contract import oracle
from c128a.files import atomic_write_json
from c128a.runners import fuzz
from c128a.runners.fuzz import supervisor
from helpers import (
    TESTS,
    CliProcess,
    a_fifo,
    a_file,
    alive,
    assert_all_ended,
    descendants,
    fill_to_the_last_byte,
    free_port,
    importable_here_and_in_children,
    needs_proc,
    parents,
    short_temporary_folder,
    small_tmpfs,
    wait_until,
)
from fault_targets import (
    CASES_DIR_ENV,
    CHILD_PIDS_ENV,
    FAULT_PROPERTIES,
    FIRST_WRONG_MARKER_ENV,
    HISTORICAL_STEP,
    slow_failing,
)
from test_fuzz import MACHINE_SPEC, PLANT_ENV, lens_mutant, make_config, standin_machine

pytestmark = [
    needs_proc,
    pytest.mark.slow,  # each runs real fuzz processes, most until a signal or deadline
]

FAULTS_SPEC = "fault_targets:FAULT_PROPERTIES"


# ---------------------------------------------------------------- processes


class FuzzProcess(CliProcess):
    """``c128a fuzz`` as a child process in its own session, with its own
    temporary folder (so what it leaves behind can be seen)."""

    def __init__(self, tmp_path: Path, *options: str, target: str = "reference",
                 properties: str | None = FAULTS_SPEC, env: dict | None = None):
        # A short folder of its own: the fork server's socket path lives in it.
        self.temporary = short_temporary_folder()
        self.report_path = tmp_path / "report.json"
        self.cases_dir = tmp_path / "cases"
        super().__init__(
            tmp_path, "fuzz", "--target", target, "--device", "cpu", "--seed", "1", "--no-live",
            "--db", tmp_path / "db", "--cases-dir", self.cases_dir, "--report", self.report_path,
            *(["--properties", properties] if properties else []), *options,
            path=(TESTS,), env={"TMPDIR": str(self.temporary), "COLUMNS": "200", **(env or {})},
        )

    def running_workers(self, count: int, timeout: float = 120.0) -> set[int]:
        """Wait until ``count`` workers run examples (each has an in-flight
        file); their pids and every other descendant's."""
        wait_until(
            lambda: len(list(self.temporary.glob("c128a-fuzz-*/worker-*.json"))) >= count,
            timeout, f"{count} workers running examples; stderr:\n{self.errors()}",
        )
        return descendants(self.pid)

    def report(self) -> dict:
        return json.loads(self.report_path.read_text())

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.temporary, ignore_errors=True)


@pytest.fixture
def fuzz_process(cli_process):
    """``fuzz_process(*options, target=..., properties=..., env=...)``: a
    :class:`FuzzProcess`, killed at the end of the test if it still runs."""
    return functools.partial(cli_process, kind=FuzzProcess)


def fuzz_workers(run: FuzzProcess) -> set[int]:
    """The run's worker processes now: the children of its fork server."""
    table = parents()
    servers = {
        pid for pid, parent in table.items()
        if parent == run.pid and b"forkserver" in _cmdline(pid)
    }
    return {pid for pid, parent in table.items() if parent in servers and alive(pid)}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize(
    "signum, to_group, exit_status",
    [
        (signal.SIGTERM, False, 143),
        (signal.SIGINT, False, 130),
        (signal.SIGTERM, True, 143),
        (signal.SIGINT, True, 130),
        # A closed terminal or SSH session: before, the parent died by the
        # signal, with no summary and no report.
        (signal.SIGHUP, False, 129),
        (signal.SIGHUP, True, 129),
    ],
    ids=["SIGTERM-parent", "SIGINT-parent", "SIGTERM-group", "SIGINT-group", "SIGHUP-parent",
         "SIGHUP-group"],
)
def test_a_signal_stops_the_run_like_its_deadline(fuzz_process, signum, to_group, exit_status):
    """SIGTERM/SIGINT/SIGHUP, to the parent or its group: report written with status
    interrupted, 128+signal (nothing found), no traceback, no process or
    temporary file left behind."""
    run = fuzz_process("--minutes", "2", "--workers", "2", "--only", "matches_reference",
                       "--no-stateful")
    family = run.running_workers(2)
    if to_group:
        os.killpg(run.pid, signum)
    else:
        os.kill(run.pid, signum)
    assert run.wait(20) == exit_status, run.errors()
    report = run.report()
    assert report["status"] == "interrupted"
    assert report["interrupted_by"] == signal.Signals(signum).name
    assert report["exit_status"] == exit_status
    assert report["totals"]["examples"] > 0
    assert "Traceback" not in run.errors()
    assert f"run interrupted by {signal.Signals(signum).name}" in run.errors()
    assert_all_ended(family)
    assert list(run.temporary.iterdir()) == []


SIGRTMIN_3 = signal.SIGRTMIN + 3  # 37 on Linux: no name in signal.Signals


@pytest.mark.parametrize(
    "signum, named",
    [
        (SIGRTMIN_3, f"signal {SIGRTMIN_3}, SIGRTMIN+3"),
        # Its handler stops the worker after its example; the run's stop is
        # not set, so the worker is a lost one, not a finished one.
        (signal.SIGTERM, "signal SIGTERM"),
    ],
    ids=["SIGRTMIN+3", "SIGTERM"],
)
def test_a_signal_to_one_worker_is_a_crash_and_the_worker_restarts(fuzz_process, signum, named):
    """One worker, not the parent, ends by a signal: it is restarted, its
    in-flight input is saved as a crash case naming the signal, and the run
    goes on to its summary and report."""
    run = fuzz_process("--minutes", "2", "--workers", "1", "--only", "matches_reference",
                       "--no-stateful")
    run.running_workers(1)
    [first] = fuzz_workers(run)
    os.kill(first, signum)
    wait_until(
        lambda: run.process.poll() is not None
        or (list(run.cases_dir.glob("*.json")) and fuzz_workers(run) - {first}),
        60, f"a crash case and a restarted worker; stderr:\n{run.errors()}",
    )
    if run.process.poll() is None:
        os.kill(run.pid, signal.SIGTERM)
    assert run.wait(20) == 1, run.errors()
    assert run.report_path.exists(), f"no report; stderr:\n{run.errors()}"
    report = run.report()
    assert report["status"] == "interrupted", report
    assert report["totals"]["crashes"] == 1 and report["totals"]["restarts"] == 1, report
    [entry] = report["cases"]
    case = cases.load_case(entry["path"])
    assert case.kind == "crash" and case.batch is not None
    assert named in case.failure, case.failure
    errors = run.errors()
    assert "c128a fuzz summary" in errors and "Traceback" not in errors


def test_the_runs_temporary_folder_deleted_mid_run_is_made_again(fuzz_process):
    """The run's temporary folder (in-flight files) is deleted, then a worker
    dies: the supervisor makes the folder again, the restarted worker runs,
    and the run ends by its signal with the crash counted. (Before: the
    restarted worker could not open its in-flight file, a fatal error, and
    the run aborted on its own.)"""
    run = fuzz_process("--minutes", "2", "--workers", "1", "--only", "matches_reference",
                       "--no-stateful")
    run.running_workers(1)
    [folder] = run.temporary.glob("c128a-fuzz-*")
    [first] = fuzz_workers(run)
    shutil.rmtree(folder)
    os.kill(first, signal.SIGKILL)  # its restart opens its in-flight file in the folder
    wait_until(
        lambda: run.process.poll() is not None or list(folder.glob("worker-*.json")),
        60, f"the restarted worker running examples; stderr:\n{run.errors()}",
    )
    if run.process.poll() is None:
        os.kill(run.pid, signal.SIGTERM)
    assert run.wait(20) == 1, run.errors()
    report = run.report()
    assert report["status"] == "interrupted" and report["error"] is None, report
    assert report["totals"]["crashes"] == 1 and report["totals"]["restarts"] == 1, report
    [entry] = report["cases"]
    assert entry["kind"] == "crash" and "temporary folder" in entry["failure"], entry
    errors = run.errors()
    assert "was deleted; made again" in errors and "Traceback" not in errors
    assert list(run.temporary.iterdir()) == []


def test_a_killed_workers_temporary_files_go_with_the_run(fuzz_process):
    """Each example ends its worker by SIGKILL while a temporary file of its
    is open, as a worker killed mid-write of Hypothesis's database would:
    the file is in the run's folder, and the run leaves nothing in $TMPDIR.
    (Before: each killed worker left a ``tmp*`` file in $TMPDIR.)"""
    run = fuzz_process("--max-examples", "3", "--workers", "1", "--no-stateful",
                       "--only", "crashes_holding_a_temporary_file")
    status = run.wait(120)
    report = run.report()
    assert report["error"] is None and report["totals"]["crashes"] >= 1, report
    assert status == report["exit_status"] == 1, run.errors()
    assert list(run.temporary.iterdir()) == []


def test_sigkill_of_the_parent_ends_every_worker(fuzz_process):
    """A parent killed without warning takes its workers with it within seconds."""
    run = fuzz_process("--minutes", "2", "--workers", "2", "--only", "matches_reference",
                       "--no-stateful")
    family = run.running_workers(2)
    assert len(family) >= 2
    os.kill(run.pid, signal.SIGKILL)
    run.wait(10)
    assert_all_ended(family, timeout=10)


def test_failure_found_before_a_signal_is_saved_while_it_shrinks(fuzz_process):
    """A 2 s-a-call target: the first failing example is saved before shrinking
    starts, and kept when SIGTERM cuts the shrinking short (exit 1)."""
    run = fuzz_process("--minutes", "2", "--workers", "1", "--only", "matches_reference",
                       "--no-stateful", "--example-timeout", "60",
                       target="fault_targets:slow_failing")
    family = run.running_workers(1)
    [saved] = wait_until(lambda: list(run.cases_dir.glob("*.json")), 60,
                         f"the first failing example saved; stderr:\n{run.errors()}")
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(20) == 1, run.errors()
    report = run.report()
    assert report["status"] == "interrupted" and report["totals"]["failures"] == 1
    [entry] = report["cases"]
    assert entry["shrunk"] is False and "shrinking was cut short" in entry["note"]
    # The first failing example, or a smaller one the shrinking found before
    # the signal, which replaced it.
    kept = Path(entry["path"])
    assert list(run.cases_dir.glob("*.json")) == [kept]
    assert kept == saved or "smallest failing example found by then" in entry["note"], entry
    case = cases.load_case(kept)
    assert case.kind == "failure" and case.batch is not None
    assert not cases.replay_case(case, slow_failing, "cpu", properties=FAULT_PROPERTIES).passed
    correct = SimpleNamespace(build_c128a_topk_metadata=oracle.build_c128a_topk_metadata)
    assert cases.replay_case(case, correct, "cpu", properties=FAULT_PROPERTIES).passed
    assert_all_ended(family)


@pytest.mark.parametrize("stop", ["SIGTERM-group", "SIGKILL-parent"])
def test_serving_loop_failure_found_before_a_stop_is_saved_while_it_shrinks(
    fuzz_process, tmp_path, stop
):
    """The serving loop's target answers wrong after 2 s, so shrinking takes
    minutes: its first failing example (steps and blob) is saved before
    shrinking starts and kept when SIGTERM to the run's process group, 0.3 s
    after the first wrong answer, cuts the shrinking short (exit 1), or when
    the parent is killed outright. (Before, the round reported nothing until
    it had shrunk: exit 143, failures 0, no case.)"""
    marker = tmp_path / "first-wrong-answer"
    run = fuzz_process("--minutes", "5", "--workers", "1", "--only", "serving_loop",
                       "--stateful", "--machine", MACHINE_SPEC, "--example-timeout", "120",
                       target="fault_targets:slow_when_wrong",
                       env={FIRST_WRONG_MARKER_ENV: str(marker)})
    family = run.running_workers(1)
    wait_until(marker.exists, 120, f"the target's first wrong answer; stderr:\n{run.errors()}")
    family |= descendants(run.pid)
    if stop == "SIGTERM-group":
        time.sleep(0.3)
        os.killpg(run.pid, signal.SIGTERM)
        assert run.wait(60) == 1, run.errors()
        report = run.report()
        assert report["status"] == "interrupted" and report["totals"]["failures"] == 1, report
        [entry] = report["cases"]
        assert entry["kind"] == "serving_loop" and entry["shrunk"] is False, entry
        assert "shrinking was cut short" in entry["note"]
        [saved] = run.cases_dir.glob("*.json")
        assert entry["path"] == str(saved)
    else:
        [saved] = wait_until(lambda: list(run.cases_dir.glob("*.json")), 60,
                             f"the first failing example saved; stderr:\n{run.errors()}")
        os.kill(run.pid, signal.SIGKILL)
        run.wait(20)
        assert list(run.cases_dir.glob("*.json")) == [saved]
    case = cases.load_case(saved)
    assert case.kind == "serving_loop" and case.reproduce_blob, case
    assert "state.step(position=" in case.steps, case.steps
    still = cases.replay_case(case, lens_mutant, "cpu", machine_factory=standin_machine)
    assert not still.passed and "decode_lens differs" in still.report, still.report
    correct = SimpleNamespace(build_c128a_topk_metadata=oracle.build_c128a_topk_metadata)
    fixed = cases.replay_case(case, correct, "cpu", machine_factory=standin_machine)
    assert fixed.passed, fixed.report
    assert_all_ended(family)


BOUND_SLACK_S = 4.0
"""What a run may take past its deadline and grace on a loaded machine: the
poll, the kills, the report (the bound
docs/explanation/fuzz-runner.md states is 10 s in all)."""


def test_failure_still_shrinking_when_the_deadline_grace_ends_is_saved(tmp_path, monkeypatch):
    """The deadline's grace period ends while the worker is inside an
    example of its shrinking (each takes a minute): the worker is killed,
    the failure stays saved (it gave `clean`, exit 0, before)."""
    monkeypatch.setattr(supervisor, "STOP_GRACE_S", 1.0)
    monkeypatch.syspath_prepend(str(TESTS))
    minutes = 0.2  # room for the first failure on a loaded machine
    config = make_config(tmp_path, target="fault_targets:stuck_while_it_shrinks",
                         max_examples=None, minutes=minutes, example_timeout=120.0,
                         properties=FAULTS_SPEC)
    report = fuzz.run_fuzz(config)
    assert report["exit_status"] == 1 and report["status"] == "failures", report
    assert report["per_worker"][0]["state"] == "killed at stop"
    [entry] = report["cases"]
    assert entry["shrunk"] is False and "killed at the stop" in entry["note"]
    assert cases.load_case(entry["path"]).batch is not None
    assert report["elapsed_s"] < minutes * 60 + 1.0 + BOUND_SLACK_S, report["elapsed_s"]


def test_a_failure_still_shrinking_at_the_deadline_ends_the_run_by_it(tmp_path, monkeypatch):
    """A 2 s-a-call target whose failure takes minutes to shrink, under
    --exitfirst: the run ends by its deadline plus the stop's grace, keeping
    the failure shrunk as far as it got, and saying so. (Before: shrinking
    went on for up to max(30 s, --example-timeout) past the deadline: 175 s
    for a 30 s run with -x.)"""
    monkeypatch.syspath_prepend(str(TESTS))
    minutes = 0.2  # room for the first failure on a loaded machine
    for _ in range(3):
        config = make_config(tmp_path, target="fault_targets:slow_failing", max_examples=None,
                             minutes=minutes, example_timeout=60.0, exitfirst=True,
                             properties=FAULTS_SPEC)
        started = time.monotonic()
        report = fuzz.run_fuzz(config)
        took = time.monotonic() - started
        assert took < minutes * 60 + supervisor.STOP_GRACE_S + BOUND_SLACK_S, took
        if report["totals"]["failures"]:
            break
        # A loaded host (a GPU machine's 16 xdist workers) ran two passing
        # examples in 12 s and no failing one: this case needs a failure
        # found before the deadline, so it runs again with twice the time.
        minutes *= 2
    assert report["exit_status"] == 1 and report["status"] == "failures", report
    [entry] = report["cases"]
    assert entry["shrunk"] is False and "shrinking was cut short" in entry["note"], entry
    case = cases.load_case(entry["path"])
    assert case.kind == "failure" and case.batch is not None
    assert not cases.replay_case(case, slow_failing, "cpu", properties=FAULT_PROPERTIES).passed


def test_one_minute_run_on_a_real_mutant_interrupted_at_20_s(fuzz_process):
    """The issue's acceptance run: off_by_one_length for a minute, SIGTERM at
    20 s: exit 1 within 10 s, report `interrupted`, every case saved, no
    process left."""
    run = fuzz_process("--minutes", "1", "--workers", "2", properties=None,
                       target="c128a.mutants:off_by_one_length")
    family = run.running_workers(2)
    time.sleep(max(0.0, 20 - (time.monotonic() - run_started(run))))
    family |= descendants(run.pid)
    os.kill(run.pid, signal.SIGTERM)
    signalled = time.monotonic()
    assert run.wait(10) == 1, run.errors()
    assert time.monotonic() - signalled < 10
    report = run.report()
    assert report["status"] == "interrupted" and report["exit_status"] == 1
    found = report["totals"]["failures"] + report["totals"]["crashes"] + report["totals"]["hangs"]
    assert found >= 1
    assert len(report["cases"]) == found
    for entry in report["cases"]:
        assert entry["path"] and Path(entry["path"]).exists(), entry
        cases.load_case(entry["path"])
    assert_all_ended(family)
    assert "Traceback" not in run.errors()


def run_started(run: FuzzProcess) -> float:
    """When the child started, on this process's monotonic clock."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(Path(f"/proc/{run.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.monotonic() - (uptime - start / ticks)


# ---------------------------------------------------------------- what a failure is


def test_failure_outside_the_contract_is_saved_and_says_so(tmp_path, capsys, c128a_device):
    """A policy without the 128 floor gives an unaligned width: the case is
    saved, marked outside the contract, and replays as fixed on a correct target."""
    status = cli.main([
        "fuzz", "--target", "c128a.mutants:width_without_floor", "--device", c128a_device.type,
        "--max-examples", "200", "--workers", "1", "--seed", "1", "--only", "matches_oracle",
        "--no-stateful", "--no-live", "--exitfirst", "--db", "none",
        "--cases-dir", str(tmp_path / "cases"), "--report", str(tmp_path / "report.json"),
    ])
    assert status == 1
    report = json.loads((tmp_path / "report.json").read_text())
    [entry] = report["cases"]
    assert "multiple of 128" in entry["outside_contract"]
    case = cases.load_case(entry["path"])
    assert case.outside_contract and case.batch.width % 128
    assert "outside contract" in capsys.readouterr().err
    device = ["--device", c128a_device.type]
    assert cli.main(["replay", entry["path"], *device]) == 1
    assert cli.main(["replay", entry["path"], *device, "--target", "reference"]) == 0


def test_target_policy_raising_is_a_failure_with_its_blob(tmp_path, monkeypatch):
    """The target's own width policy raises while a step is drawn: a failure
    case with the reproduce blob (not an aborted run), replayable from it."""
    monkeypatch.syspath_prepend(str(TESTS))
    config = make_config(tmp_path, target="fault_targets:policy_raises", exitfirst=True,
                         properties="c128a.checks:PROPERTIES", only=("matches_oracle",))
    report = fuzz.run_fuzz(config)
    assert report["exit_status"] == 1 and report["error"] is None, report
    [entry] = report["cases"]
    case = cases.load_case(entry["path"])
    assert case.kind == "failure" and case.batch is None and case.reproduce_blob
    assert "active_topk_width raised RuntimeError: width policy bug" in case.failure
    from c128a.targets import load_target

    target = load_target("fault_targets:policy_raises")
    assert not cases.replay_case(case, target, "cpu").passed
    assert cases.replay_case(case, load_target("reference"), "cpu").passed


def test_a_target_exiting_with_status_3_on_the_cpu_is_a_crash_not_a_cuda_fault(
    tmp_path, monkeypatch
):
    """``sys.exit(3)`` inside a target on the CPU: a crash case saying the
    worker exited with status 3. (Before: "died (CUDA fault)", on a run
    with no GPU; 3 is a worker's own status after a CUDA fault.)"""
    monkeypatch.syspath_prepend(str(TESTS))
    config = make_config(tmp_path, target="fault_targets:exits_3", exitfirst=True,
                         properties=FAULTS_SPEC)
    report = fuzz.run_fuzz(config)
    assert report["exit_status"] == 1 and report["totals"]["crashes"] == 1, report
    [entry] = report["cases"]
    case = cases.load_case(entry["path"])
    assert case.kind == "crash" and case.batch is not None
    assert "worker 0 died (exit 3) running this input" in case.failure, case.failure
    assert "CUDA" not in case.failure


def test_a_target_raising_keyboard_interrupt_is_a_crash_without_a_traceback(fuzz_process):
    """A worker ignores SIGINT, so a KeyboardInterrupt there is the target's:
    a crash case naming it, and no traceback. (Before: "Process
    c128a-fuzz-0: Traceback ... KeyboardInterrupt", and "died (exit 1)".)"""
    run = fuzz_process("--max-examples", "3", "--workers", "1", "--only", "matches_reference",
                       "--no-stateful", "--exitfirst", target="fault_targets:interrupts")
    assert run.wait(120) == 1, run.errors()
    report = run.report()
    assert report["totals"]["crashes"] == 1 and report["error"] is None, report
    [entry] = report["cases"]
    assert "died (KeyboardInterrupt raised by the code it ran, exit 130)" in entry["failure"]
    assert cases.load_case(entry["path"]).batch is not None
    assert "Traceback" not in run.errors(), run.errors()


def test_suite_fault_in_a_property_is_an_error_not_a_failure(tmp_path, monkeypatch):
    """A harness assertion inside a property is reported as the suite's error
    (exit 2), never saved as a failure of the target."""
    monkeypatch.syspath_prepend(str(TESTS))
    report = fuzz.run_fuzz(make_config(tmp_path, only=("harness_bug",), max_examples=5,
                                       properties=FAULTS_SPEC))
    assert report["exit_status"] == 2 and report["totals"]["failures"] == 0, report
    assert any("the suite itself failed" in error for error in report["errors"])
    assert not list((tmp_path / "cases").glob("*.json"))


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--cases-dir", a_file, "--cases-dir"),
        ("--cases-dir", lambda tmp: "/proc/c128a-cases", "--cases-dir"),
        ("--report", lambda tmp: "/proc/c128a-reports/report.json", "--report"),
        ("--report", lambda tmp: tmp, "--report"),
        # The report's temporary file, beside it, would need a name over 255 bytes.
        ("--report", lambda tmp: tmp / ("r" * 250 + ".json"), "File name too long"),
        ("--report", lambda tmp: a_fifo(tmp, "report.fifo"), "named pipe (FIFO), not a regular file"),
        ("--db", lambda tmp: a_file(tmp) / "db", "--db"),
        ("--db", lambda tmp: f"redis://127.0.0.1:{free_port()}/0", "--db"),
    ],
    ids=["cases-dir-is-a-file", "cases-dir-cannot-be-made", "report-folder-unwritable",
         "report-is-a-folder", "report-name-too-long", "report-is-a-fifo", "db-cannot-be-made",
         "redis-does-not-answer"],
)
def test_bad_path_is_refused_before_any_worker_starts(
    tmp_path, capsys, c128a_device, option, value, message
):
    """Exit 2 naming the option; no worker ran, no report or case written."""
    arguments = {"--cases-dir": str(tmp_path / "cases"), "--report": str(tmp_path / "r.json"),
                 "--db": str(tmp_path / "db")}
    arguments[option] = str(value(tmp_path))
    command = ["fuzz", "--target", "reference", "--device", c128a_device.type,
               "--max-examples", "5", "--workers", "1", "--no-live", "--properties", FAULTS_SPEC,
               "--no-stateful", "--only", "matches_reference"]  # a run would exit 0
    for name, given in arguments.items():
        command += [name, given]
    assert cli.main(command) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert "c128a fuzz summary" not in error  # no run happened
    assert not (tmp_path / "r.json").exists()


def test_case_that_cannot_be_written_mid_run_is_kept_in_the_report(tmp_path, monkeypatch, capsys):
    """The cases folder turns into a file mid-run: the run goes on, the case is
    kept whole in the report and the summary says where it could not go."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv(CASES_DIR_ENV, str(tmp_path / "cases"))
    (tmp_path / "cases").mkdir()
    config = make_config(tmp_path, target="test_fuzz:lens_mutant", only=("loses_cases_dir",),
                         properties=FAULTS_SPEC, max_examples=300)
    report = fuzz.run_fuzz(config)
    assert report["exit_status"] == 1, report
    [entry] = report["cases"]
    assert entry["path"] is None and "cases" in entry["not_written"]
    kept = cases.Case.from_json(entry["case"])
    assert kept.batch is not None and kept.property == "loses_cases_dir"
    assert "NOT WRITTEN" in capsys.readouterr().err


@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """A real full filesystem: a 64 KiB tmpfs holding a ``cases`` folder and a
    file that took every free byte. Creating a file there still works (the
    run's start-up checks pass, as they would on a disk that fills during
    the run); writing one byte into it fails with ENOSPC. The user's cache
    (a fallback folder for refused cases) is the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with small_tmpfs(tmp_path / "full") as mount_point:
        (mount_point / "cases").mkdir()
        fill_to_the_last_byte(mount_point)
        yield mount_point


def _between(text: str, title: str) -> str:
    """The JSON a BEGIN/END block of that title holds."""
    begin = text.index(f"----- BEGIN {title}")
    start = text.index("\n", begin) + 1
    return text[start:text.index(f"----- END {title} -----", start)]


def test_a_full_disk_holding_the_cases_and_the_report_loses_no_finding(
    tmp_path, monkeypatch, capsys, full_disk
):
    """The cases folder and the report on one full disk (ENOSPC): the case
    reaches stderr whole, marked, as JSON a person can save and replay.
    (Before: "NOT WRITTEN" with the failure's first line, then "could not
    write the report": the case's input was lost.)"""
    monkeypatch.syspath_prepend(str(TESTS))
    config = make_config(tmp_path, target="test_fuzz:lens_mutant", properties=FAULTS_SPEC,
                         max_examples=300, exitfirst=True, cases_dir=str(full_disk / "cases"),
                         report=str(full_disk / "report.json"))
    report = fuzz.run_fuzz(config)
    assert report["exit_status"] == 1, report
    errors = capsys.readouterr().err
    assert "could not write the report" in errors and "No space left on device" in errors
    assert not (full_disk / "report.json").exists()
    kept = json.loads(_between(errors, "c128a report cases that could not be written"))
    assert kept == report["cases"] and len(kept) >= 1
    for entry in kept:
        assert "No space left on device" in entry["not_written"]
        case = cases.Case.from_json(entry["case"])
        assert case.batch is not None and case.property == "matches_reference"
        assert not cases.replay_case(case, lens_mutant, "cpu", properties=FAULT_PROPERTIES).passed


def test_a_case_the_disk_refuses_reaches_stderr_whole(tmp_path, monkeypatch, capsys, full_disk):
    """Only the cases folder is full; the report is written elsewhere: the
    unwritten case is printed whole too, not its first line alone."""
    monkeypatch.syspath_prepend(str(TESTS))
    config = make_config(tmp_path, target="test_fuzz:lens_mutant", properties=FAULTS_SPEC,
                         max_examples=300, exitfirst=True, cases_dir=str(full_disk / "cases"))
    report = fuzz.run_fuzz(config)
    assert report["exit_status"] == 1, report
    errors = capsys.readouterr().err
    [entry] = [e for e in json.loads(Path(config.report).read_text())["cases"]
               if e.get("not_written")]
    block = _between(errors, "c128a case that could not be written")
    printed = cases.Case.from_json(json.loads(block))
    assert printed.to_json() == entry["case"] and printed.batch is not None


# ---------------------------------------------------------------- cases on disk


def test_case_files_and_reports_get_the_usual_mode(tmp_path):
    """0666 under the umask (0644 with 022), not a temporary file's 0600."""
    previous = os.umask(0o022)
    try:
        case = cases.new_case(property="p", target="t", kind="crash", failure="f", seed=1)
        path, new = cases.write_case(case, tmp_path)
        atomic_write_json(tmp_path / "report.json", {"a": 1})
    finally:
        os.umask(previous)
    assert new
    for written in (path, tmp_path / "report.json"):
        assert stat.S_IMODE(written.stat().st_mode) == 0o644


def test_one_writer_claims_a_shared_case_new(tmp_path):
    """Runs sharing --cases-dir race to save one failure: exactly one says new,
    and no temporary file is left."""
    case = cases.new_case(property="p", target="t", kind="crash", failure="f", seed=7)
    start = threading.Barrier(8)
    claims = []

    def save():
        start.wait()
        claims.append(cases.write_case(case, tmp_path)[1])

    threads = [threading.Thread(target=save) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claims) == [False] * 7 + [True]
    assert [p.name for p in tmp_path.iterdir()] == [cases.case_filename(case)]


def test_crash_cases_without_inputs_differ_by_seed_and_target():
    """Serving-loop crashes no longer collapse into one file."""
    def crash(**fields):
        values = dict(property="serving_loop", target="triton", kind="crash",
                      failure="worker died", seed=1, round_examples=5)
        values.update(fields)
        return cases.case_filename(cases.new_case(**values))

    names = {crash(), crash(seed=2), crash(target="reference"), crash(kind="hang")}
    assert len(names) == 4


def test_serving_loop_crash_replays_from_its_seed_or_says_it_cannot():
    """A crashed round replays from its seed and size; without them the case
    cannot be replayed (exit 2), never an unknown property."""
    correct = SimpleNamespace(build_c128a_topk_metadata=oracle.build_c128a_topk_metadata)
    round_case = cases.new_case(property="serving_loop", target="reference", kind="crash",
                                failure="worker died", seed=11, round_examples=3,
                                profile="ci", steps="a round")
    outcome = cases.replay_case(round_case, correct, "cpu", machine_factory=standin_machine)
    assert outcome.passed, outcome.report
    assert "seed 11" in outcome.report
    bare = cases.new_case(property="serving_loop", target="reference", kind="crash",
                          failure="worker died", steps="a round")
    outcome = cases.replay_case(bare, correct, "cpu", machine_factory=standin_machine)
    assert outcome.verdict == cases.CANNOT_REPLAY and not outcome.replayable


def test_serving_loop_crash_case_via_the_command_line(tmp_path, capsys, c128a_device):
    """``c128a replay`` of a crash case with no inputs and no seed: exit 2, the reason."""
    case = cases.new_case(property="serving_loop", target="reference", kind="crash",
                          failure="worker died", steps="a round")
    path, _ = cases.write_case(case, tmp_path)
    assert cli.main(["replay", str(path), "--device", c128a_device.type,
                     "--machine", MACHINE_SPEC]) == 2
    out = capsys.readouterr()
    assert "cannot" in (out.out + out.err).lower()
    assert "STILL FAILS" not in out.out


# ---------------------------------------------------------------- a hung test


def test_hung_test_fails_by_name_and_the_run_goes_on(pytester):
    """pytest-timeout: a test that never returns fails, named, and the tests
    after it still run (under xdist, as users run the suite)."""
    pytester.makepyfile(test_hangs="""
        import time
        import pytest

        @pytest.mark.timeout(2)
        def test_never_returns():
            time.sleep(3600)

        def test_after_it():
            pass
    """)
    # Without the suite's plugin: what is tested is pytest-timeout under
    # xdist, and the plugin would import torch in both child processes.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:c128a.plugin.pytest_plugin",
                                           "-n", "1", "-p", "xdist", timeout=120)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_never_returns*"])
    assert "Timeout" in result.stdout.str() + result.stderr.str()


def test_the_suite_sets_a_per_test_timeout(pytestconfig):
    """The project's own limit (pyproject.toml), generous for the interpreter."""
    assert float(pytestconfig.getini("timeout")) >= 600


def test_a_stop_in_the_middle_of_a_serving_loop_round_is_no_error(tmp_path, c128a_device):
    """The stop ends a machine example early, which Hypothesis reads as
    inconsistent data generation (FlakyStrategyDefinition): that is the stop,
    not a fault of the suite (the H200's 16-worker fuzz run reported it as one)."""
    import queue
    import threading

    from c128a.runners.fuzz import worker as fuzz_worker

    config = make_config(tmp_path, machine="c128a.replay:serving_loop_machine", stateful=True,
                         only=("serving_loop",), max_examples=None, minutes=1, profile="fuzz",
                         device=c128a_device.type)  # in this process: the session's device
    for round_number in range(3):
        channel, stop = queue.Queue(), threading.Event()
        worker = fuzz_worker.Worker(0, 0, config, channel, stop, str(tmp_path / "inflight.json"),
                                    None)
        threading.Timer(0.5, stop.set).start()
        worker.machine_round(round_number, 200)
        messages = []
        while not channel.empty():
            messages.append(channel.get())
        assert [m for m in messages if m.kind in ("error", "failure")] == []


def test_a_temporary_folder_too_long_for_the_fork_servers_socket_is_refused(fuzz_process,
                                                                         tmp_path):
    """The workers' fork server binds a Unix socket in TMPDIR: a folder past
    Linux's path limit failed at the first spawn, after the run had started
    (a traceback per worker, no example run). Now it is a usage error first."""
    long_folder = Path("/tmp") / ("c128a-" + "x" * 80)
    long_folder.mkdir(exist_ok=True)
    try:
        run = fuzz_process("--minutes", "0.1", "--only", "matches_reference",
                           env={"TMPDIR": str(long_folder)})
        assert run.wait(60) == 2
        [line] = run.errors().splitlines()
        assert f"the temporary folder {long_folder} is {len(str(long_folder))} bytes long" in line
        assert "set TMPDIR to a shorter folder" in line
    finally:
        shutil.rmtree(long_folder, ignore_errors=True)


# ---------------------------------------------------------------- nothing only in memory


class SignalsItself(io.StringIO):
    """A console's file that sends this process ``signum`` the first time
    the text ``when`` is written to it: a real signal in the phase that
    writes it."""

    def __init__(self, when: str, signum: int = signal.SIGTERM):
        super().__init__()
        self.when, self.signum, self.sent = when, signum, False

    def write(self, text: str) -> int:
        written = super().write(text)
        if not self.sent and self.when in self.getvalue():
            self.sent = True
            os.kill(os.getpid(), self.signum)
        return written

    @property
    def text(self) -> str:
        return self.getvalue()


@pytest.fixture
def sigterm_must_be_handled():
    """SIGTERM that reaches this process's own handler fails the test: the
    run must handle it in every phase (else, outside pytest, it dies by it)."""

    def unhandled(signum, frame):
        raise AssertionError("SIGTERM reached the default handler: the run did not handle it")

    previous = signal.signal(signal.SIGTERM, unhandled)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_during_the_summary_with_the_cases_folder_full_loses_nothing(
    tmp_path, monkeypatch, full_disk, sigterm_must_be_handled
):
    """The cases folder is full: the case is written at once beside the
    report (c128a-unwritten-cases/), saying where; SIGTERM during the summary
    then ends the run with its report written, marked interrupted, and one
    line. (Before: the case lived in memory until the summary; SIGTERM there
    was exit 143, no case, no report, nothing printed.)"""
    monkeypatch.syspath_prepend(str(TESTS))
    console_file = SignalsItself("c128a fuzz summary")
    config = make_config(tmp_path, target="test_fuzz:lens_mutant", properties=FAULTS_SPEC,
                         max_examples=300, exitfirst=True, cases_dir=str(full_disk / "cases"))
    report = fuzz.run_fuzz(config, Console(file=console_file, width=200))
    assert report["status"] == "interrupted" and report["interrupted_by"] == "SIGTERM", report
    assert report["exit_status"] == 1, report
    assert json.loads(Path(config.report).read_text()) == report
    [saved] = (tmp_path / "c128a-unwritten-cases").glob("*.json")
    case = cases.load_case(saved)
    assert not cases.replay_case(case, lens_mutant, "cpu", properties=FAULT_PROPERTIES).passed
    [entry] = report["cases"]
    assert entry["saved_elsewhere"] == str(saved) and "No space left" in entry["not_written"]
    printed = console_file.text
    assert f"saved instead as {saved}" in printed
    assert "run interrupted by SIGTERM while it ended" in printed
    assert f"written to {config.report}, status interrupted" in printed


def test_a_case_the_full_folder_refused_is_written_there_once_it_has_room(
    tmp_path, monkeypatch, full_disk
):
    """The run keeps trying the cases folder: room made after a crash case
    went to the fallback folder, the case ends in the cases folder and its
    fallback copy goes."""
    monkeypatch.setenv(PLANT_ENV, str(tmp_path / "planted"))

    class FreesTheDisk(io.StringIO):
        def write(self, text: str) -> int:
            if "saved instead as" in text:
                (full_disk / "filler").unlink(missing_ok=True)
            return super().write(text)

    console_file = FreesTheDisk()
    config = make_config(tmp_path, only=("crashes_once",), max_examples=20,
                         cases_dir=str(full_disk / "cases"))
    report = fuzz.run_fuzz(config, Console(file=console_file, width=200))
    assert report["exit_status"] == 1 and report["totals"]["crashes"] == 1, report
    [entry] = report["cases"]
    assert Path(entry["path"]).parent == full_disk / "cases", entry
    assert "No space left" in entry["written_late"] and "not_written" not in entry
    assert cases.load_case(entry["path"]).batch is not None
    assert list((tmp_path / "c128a-unwritten-cases").glob("*.json")) == []
    assert f"case written to {entry['path']} now" in console_file.getvalue()


def test_sigterm_while_the_report_is_written_leaves_it_written_and_interrupted(
    tmp_path, monkeypatch, sigterm_must_be_handled
):
    """SIGTERM arrives as the report is written: it is written (again),
    marked interrupted; one line says so."""
    from c128a.runners.fuzz import ending

    write = ending.atomic_write_json

    def signalled_first(path, data):
        os.kill(os.getpid(), signal.SIGTERM)
        write(path, data)

    monkeypatch.setattr(ending, "atomic_write_json", signalled_first)
    console_file = io.StringIO()
    config = make_config(tmp_path, max_examples=5)
    report = fuzz.run_fuzz(config, Console(file=console_file, width=200))
    assert report["status"] == "interrupted" and report["exit_status"] == 143, report
    assert json.loads(Path(config.report).read_text())["status"] == "interrupted"
    assert "run interrupted by SIGTERM while it ended" in console_file.getvalue()


def test_sigterm_while_the_command_starts_says_so_in_one_line(fuzz_process):
    """SIGTERM while the command imports torch (its first seconds): exit 143
    and one line saying nothing ran. (Before: killed by the signal, nothing
    printed.)"""
    run = fuzz_process("--minutes", "1", "--workers", "1", "--only", "matches_reference")
    wait_until(lambda: b"torch" in _maps(run.pid), 60, "the command importing torch")
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(60) == 143, run.errors()
    [line] = run.errors().splitlines()
    assert "interrupted by SIGTERM while starting" in line and "Traceback" not in line
    assert not run.report_path.exists()


def test_sigterm_while_the_target_loads_says_so_in_one_line(fuzz_process, tmp_path,
                                                             monkeypatch):
    """SIGTERM while the target's module is imported (after the command
    line started, before any worker): exit 143 and one line. (Before:
    killed by the signal, nothing printed.)"""
    marker = tmp_path / "importing"
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "slow_to_import.py").write_text(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(120)\n"
    )
    importable_here_and_in_children(modules, monkeypatch)
    run = fuzz_process("--minutes", "1", "--workers", "1", "--only", "matches_reference",
                       target="slow_to_import:target")
    wait_until(marker.exists, 60, f"the target's module imported; stderr:\n{run.errors()}")
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(30) == 143, run.errors()
    [line] = run.errors().splitlines()
    assert "interrupted by SIGTERM while starting, before any worker ran" in line
    assert not run.report_path.exists()


def _maps(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/maps").read_bytes()
    except OSError:
        return b""


def test_a_report_that_cannot_be_written_makes_the_run_not_clean(tmp_path, monkeypatch,
                                                                  full_disk):
    """A clean run whose report the disk refuses: exit 2, status errors, and
    it says so. (Before: exit 0.)"""
    console_file = io.StringIO()
    config = make_config(tmp_path, max_examples=5, report=str(full_disk / "report.json"))
    report = fuzz.run_fuzz(config, Console(file=console_file, width=200))
    assert report["exit_status"] == 2 and report["status"] == "errors", report
    assert "No space left on device" in report["report_not_written"]
    assert "could not write the report" in console_file.getvalue()
    assert "the run is not clean (exit 2)" in console_file.getvalue()


# ---------------------------------------------------------------- the channel


@pytest.mark.parametrize(
    "target, problem",
    [
        # The bytes shown are those read so far, with the next frame's first
        # bytes or not, so their repr may take either quote: two fragments.
        ("garbage_on_the_channel", ("bytes that are not a frame: b", "garbage, not a frame")),
        ("malformed_frame_on_the_channel", ("a frame of 12 bytes does not unpickle",)),
    ],
    ids=["garbage", "malformed-frame"],
)
def test_what_is_not_a_frame_on_a_workers_channel_is_an_error_with_a_report(
    tmp_path, monkeypatch, target, problem
):
    """Bytes a target writes into its worker's channel: an error of the
    suite (exit 2, status errors, the report says what came), the worker
    stopped, no traceback. (Before: a malformed frame was an UnpicklingError
    traceback and no report; garbage on an idle channel was dropped and the
    run `clean`.)"""
    monkeypatch.syspath_prepend(str(TESTS))
    console_file = io.StringIO()
    config = make_config(tmp_path, target=f"fault_targets:{target}", properties=FAULTS_SPEC,
                         max_examples=20)
    report = fuzz.run_fuzz(config, Console(file=console_file, width=200))
    assert report["exit_status"] == 2 and report["status"] == "errors", report
    assert report["totals"]["failures"] == 0 and report["cases"] == [], report
    [error] = report["errors"]
    assert "worker 0's channel is broken" in error, error
    assert all(fragment in error for fragment in problem), error
    assert report["per_worker"][0]["state"] == "channel broken"
    assert json.loads(Path(config.report).read_text()) == report
    assert "Traceback" not in console_file.getvalue()


def test_a_huge_frame_length_is_refused_at_once(fuzz_process):
    """A length header announcing 4 GiB on a worker's channel: refused
    before any of it is read, an error of the suite with a report. (Before:
    the supervisor read on for ever, deaf to SIGTERM and SIGINT; in its
    own process here, so that a regression hangs nothing but it.)"""
    run = fuzz_process("--max-examples", "20", "--workers", "1", "--only", "matches_reference",
                       "--no-stateful", target="fault_targets:huge_frame_header_on_the_channel")
    assert run.wait(60) == 2, run.errors()
    report = run.report()
    assert report["status"] == "errors" and report["totals"]["failures"] == 0, report
    [error] = report["errors"]
    assert "a frame header announces 4294967295 bytes, more than MAX_FRAME_BYTES" in error, error
    assert "Traceback" not in run.errors()


def test_an_unfinished_frame_never_blocks_the_supervisor(fuzz_process):
    """A header announcing 16 MiB that never come: the run still answers
    SIGTERM with its report, and the frame the worker ended inside is an
    error of the suite."""
    run = fuzz_process("--minutes", "2", "--workers", "1", "--only", "matches_reference",
                       "--no-stateful", target="fault_targets:unfinished_frame_on_the_channel")
    family = run.running_workers(1)
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(30) == 2, run.errors()
    report = run.report()
    assert report["status"] == "interrupted", report
    [error] = report["errors"]
    assert "ended inside a frame announcing 16777216 bytes" in error, error
    assert_all_ended(family)


# ---------------------------------------------------------------- a target's processes


def test_a_hung_targets_child_processes_end_with_its_worker_and_the_run(fuzz_process,
                                                                        tmp_path):
    """A target starts a sleeping child, then hangs: the hang kill ends the
    child with the worker (its process group), and SIGTERM to the run ends
    the restarted worker's child too. (Before: one orphan a hang kill, and
    one more after SIGTERM.)"""
    pids = tmp_path / "child-pids"
    pids.mkdir()
    run = fuzz_process("--minutes", "2", "--workers", "1", "--only", "matches_reference",
                       "--no-stateful", "--example-timeout", "1",
                       target="fault_targets:spawns_a_child_and_hangs",
                       env={CHILD_PIDS_ENV: str(pids)})
    children = wait_until(lambda: len(list(pids.iterdir())) >= 2 and list(pids.iterdir()), 90,
                          f"a second child (after a hang kill); stderr:\n{run.errors()}")
    first = int(min(children, key=lambda path: path.stat().st_mtime).name)
    assert_all_ended({first}, what="the hung worker's child after the hang kill")
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(30) == 1, run.errors()
    assert run.report()["totals"]["hangs"] >= 1
    assert_all_ended({int(path.name) for path in pids.iterdir()},
                     what="the targets' children after SIGTERM to the run")


def test_no_process_a_target_starts_outlives_the_run(tmp_path, monkeypatch):
    """A target starts processes that leave its worker's process group (a
    session of their own; a daemon's double fork, whose parent is gone at
    once) on every call, and its first call then kills its worker: every one
    of them has ended when the run has, those of the worker that died
    included. (Before: each outlived the run, 76 in 15 s.)"""
    pids = tmp_path / "child-pids"
    pids.mkdir()
    monkeypatch.setenv(CHILD_PIDS_ENV, str(pids))
    monkeypatch.syspath_prepend(str(TESTS))
    config = make_config(tmp_path, target="fault_targets:starts_sessions_of_its_own",
                         properties=FAULTS_SPEC, max_examples=4)

    def started() -> set[int]:
        return {int(path.name) for path in pids.iterdir() if path.name.isdigit()}

    try:
        report = fuzz.run_fuzz(config)
        assert report["totals"]["crashes"] == 1 and report["totals"]["examples"] >= 4, report
        assert len(started()) >= 4, sorted(started())
        assert_all_ended(started(), timeout=5,
                         what="processes the target started, after the run ended")
    finally:
        for pid in started():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- historical steps


@pytest.mark.parametrize("fault, kind", [("crashes", "crash"), ("hangs", "hang")])
def test_a_historical_step_that_kills_its_worker_is_saved_once_and_the_run_goes_on(
    tmp_path, monkeypatch, fault, kind
):
    """A target dies (or hangs) on a property's explicit step, which each
    worker runs in its first round: saved once as a crash (hang) case, and
    the restarted worker skips it and fuzzes on. (Before: every restart died
    on the same step: 26 crashes, 0 examples.)"""
    monkeypatch.syspath_prepend(str(TESTS))
    config = make_config(tmp_path, target=f"fault_targets:{fault}_on_the_historical_step",
                         properties="fault_targets:HISTORICAL_PROPERTIES",
                         only=("with_a_historical_step",), max_examples=20, example_timeout=1.5)
    report = fuzz.run_fuzz(config)
    assert report["totals"][fault] == 1 and report["totals"]["restarts"] == 1, report
    assert report["totals"]["examples"] >= 20, report
    assert report["per_worker"][0]["state"] == "done"
    [saved] = cases.case_files(tmp_path / "cases")
    case = cases.load_case(saved)
    assert case.kind == kind and case.batch == HISTORICAL_STEP, case


# ---------------------------------------------------------------- the run's temporary folder


def test_a_folder_left_by_a_killed_run_is_removed_by_the_next_run(fuzz_process, tmp_path,
                                                                  monkeypatch):
    """SIGKILL of the parent leaves its temporary folder (its workers die
    with it); the next run in the same temporary folder removes it, as its
    owner is gone. (Before: it stayed for good.)"""
    killed = fuzz_process("--minutes", "2", "--workers", "1", "--only", "matches_reference",
                          "--no-stateful")
    family = killed.running_workers(1)
    [left] = killed.temporary.glob("c128a-fuzz-*")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(10)
    assert_all_ended(family)
    assert left.is_dir()
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setattr(tempfile, "tempdir", str(killed.temporary))
    report = fuzz.run_fuzz(make_config(tmp_path, max_examples=3))
    assert report["exit_status"] == 0, report
    assert not left.exists()
    assert list(killed.temporary.glob("c128a-fuzz-*")) == []


# ---------------------------------------------------------------- restarts


def test_a_restarted_worker_goes_on_with_its_rotation(tmp_path, monkeypatch):
    """Every example of the first property kills the worker: each restart
    goes on with the round after the one it was lost in, so the second
    property is fuzzed all the same. (Before: each restart began at round
    0, the crashing property, until the worker gave up.)"""
    monkeypatch.syspath_prepend(str(TESTS))
    config = make_config(tmp_path, properties=FAULTS_SPEC, max_examples=15, chunk=5,
                         max_restarts=4, only=("crashes_every_time", "matches_reference"))
    report = fuzz.run_fuzz(config)
    assert report["per_property"].get("matches_reference", 0) >= 15, report["per_property"]
    assert report["totals"]["crashes"] >= 2, report["totals"]
    assert report["per_worker"][0]["state"] == "done", report["per_worker"]
    assert report["exit_status"] == 1


# ---------------------------------------------------------------- a run that checked nothing


def _module(tmp_path: Path, monkeypatch, name: str, source: str) -> str:
    """A target module ``name`` with ``source``, importable here and in the
    run's processes; its target is ``name:target``."""
    folder = tmp_path / "modules"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(source)
    importable_here_and_in_children(folder, monkeypatch)
    return f"{name}:target"


ORACLE_TARGET = """
from types import SimpleNamespace
from c128a.contract import oracle
target = SimpleNamespace(build_c128a_topk_metadata=oracle.build_c128a_topk_metadata)
"""


# Each gives (target spec, the reason the report must give, minutes): long
# enough for what comes before to be done on a loaded machine.


NO_WORKER_READY = "no worker was ready before the run stopped"


def _slow_import(tmp_path: Path, monkeypatch) -> tuple[str, str, float]:
    return (_module(tmp_path, monkeypatch, "slow_to_load", "import time\ntime.sleep(60)\n"
                    + ORACLE_TARGET), "the target was still loading when the deadline came", 0.05)


def _slow_in_workers(tmp_path: Path, monkeypatch) -> tuple[str, str, float]:
    marker = tmp_path / "loaded-once"
    return _module(tmp_path, monkeypatch, "slow_in_workers", f"""
import os, time
try:  # the first import (the run's loading of the target) is quick, the workers' are not
    os.close(os.open({str(marker)!r}, os.O_CREAT | os.O_EXCL))
except FileExistsError:
    time.sleep(60)
""" + ORACLE_TARGET), NO_WORKER_READY, 0.15


def _slow_first_example(tmp_path: Path, monkeypatch) -> tuple[str, str, float]:
    monkeypatch.syspath_prepend(str(TESTS))
    return ("fault_targets:a_minute_a_call",
            "the workers started, but the run stopped before any example ended", 0.15)


@pytest.mark.parametrize("target", [_slow_import, _slow_in_workers, _slow_first_example],
                         ids=["target-loading", "workers-starting", "first-example"])
def test_a_run_that_ran_no_example_is_not_clean_and_says_why(tmp_path, monkeypatch, target):
    """The deadline comes while the target loads, while the workers start
    (a GPU target's import and first compiles take this long), or during
    the first example: status `nothing checked`, exit 2, the summary and
    report say why, and the run ends by its deadline plus the stop's grace.
    (Before: 0 examples, `clean`, exit 0.)"""
    monkeypatch.setattr(supervisor, "STOP_GRACE_S", 1.0)
    spec, why, minutes = target(tmp_path, monkeypatch)
    for _ in range(3):
        console_file = io.StringIO()
        config = make_config(tmp_path, target=spec, max_examples=None, minutes=minutes,
                             properties=FAULTS_SPEC, example_timeout=120.0)
        started = time.monotonic()
        report = fuzz.run_fuzz(config, Console(file=console_file, width=200))
        took = time.monotonic() - started
        workers_late = report.get("nothing_checked", "").startswith(NO_WORKER_READY)
        if target is not _slow_first_example or not workers_late:
            break
        # A loaded host (a GPU machine's 16 xdist workers) still had the
        # workers starting at the deadline: this case needs it to come
        # during the first example, so it runs again with twice the time.
        minutes *= 2
    assert report["status"] == "nothing checked" and report["exit_status"] == 2, report
    assert report["totals"]["examples"] == 0
    assert why in report["nothing_checked"], report["nothing_checked"]
    assert json.loads(Path(config.report).read_text()) == report
    printed = console_file.getvalue()
    assert "c128a fuzz summary" in printed
    assert f"nothing checked: {report['nothing_checked']}" in " ".join(printed.split())
    assert took < minutes * 60 + 1.0 + BOUND_SLACK_S, took


# ---------------------------------------------------------------- a target that ends its process


def test_a_target_ending_its_process_at_import_is_one_line_and_exit_2(fuzz_process, tmp_path,
                                                                     monkeypatch):
    """The target's module calls os._exit(0) at import (as a native library
    calling exit(0) would): exit 2 and one line saying so; nothing of the
    run's processes is left. (Before: the command itself imported it and
    ended with exit 0, no output.)"""
    spec = _module(tmp_path, monkeypatch, "exits_at_import", "import os\nos._exit(0)\n")
    run = fuzz_process("--minutes", "1", "--workers", "1", "--only", "matches_reference",
                       target=spec)
    assert run.wait(60) == 2, run.output()
    [line] = run.errors().splitlines()
    assert line.startswith("c128a fuzz: target 'exits_at_import:target': its process ended "
                           "(exit 0) while the target loaded"), line
    assert "(target from --target)" in line
    assert not run.report_path.exists()
    assert list(run.temporary.iterdir()) == []


def test_a_target_ending_its_process_with_status_0_while_the_run_stops_is_a_crash(
    tmp_path, monkeypatch
):
    """--exitfirst: the first failure stops the run, and the target calls
    os._exit(0) (as a native library calling exit(0) would) in the next
    example, the shrinking's: the worker ended without saying it was done,
    a crash whose input is kept, never a worker that stopped. (Before: exit
    0 while the run stopped read as a normal stop: the crash and its input
    were lost.)"""
    monkeypatch.syspath_prepend(str(TESTS))
    config = make_config(tmp_path, target="fault_targets:exits_0_while_it_shrinks",
                         max_examples=200, exitfirst=True, properties=FAULTS_SPEC)
    report = fuzz.run_fuzz(config)
    assert report["exit_status"] == 1 and report["status"] == "failures", report
    assert report["totals"]["crashes"] == 1, report["totals"]
    [crash] = [entry for entry in report["cases"] if entry["kind"] == "crash"]
    case = cases.load_case(crash["path"])
    assert case.batch is not None, case
    assert "died (exit 0 without saying it was done" in case.failure, case.failure
