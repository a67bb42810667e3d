"""``c128a replay`` under real processes and signals: what its child
processes leave behind, when its clock starts, and what a crash of one case
does to the others.

Each replay here is a real ``c128a replay`` process (in its own session, so
a signal to it reaches nobody else) with its real child; the stand-in
targets are written to a temporary folder put on ``PYTHONPATH``. Processes
are followed through ``/proc`` (Linux).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from c128a import cases, cli
from c128a.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from helpers import (
    PACKAGE_ROOT,
    alive,
    assert_all_ended,
    child_environment,
    importable_here_and_in_children,
    needs_proc,
    on_trigger_source,
    wait_until,
)
from test_cases import THRESHOLD, make_case

pytestmark = [
    needs_proc,
    pytest.mark.slow,  # each starts real replay processes, which import torch
]

STANDIN_MODULE = "standin_replay_processes_c128a_test"
PIDS_ENV = "C128A_TEST_REPLAY_PIDS"
SLOW_START_ENV = "C128A_TEST_SLOW_CHILD_START"
SLOW_START_S = 8.0
STANDIN_SOURCE = f'''
import os
import subprocess
import sys
import time
from types import SimpleNamespace

from c128a.contract import oracle

if "--in-process" in sys.argv and os.environ.get("{SLOW_START_ENV}"):
    # The start-up a replay's child pays (torch, compiles) made long and
    # sure; only in the child, so that the test's own process does not wait.
    time.sleep({SLOW_START_S})

{on_trigger_source(THRESHOLD)}

GRANDCHILD = """
import os, signal, sys, time
# SIGINT ends it by the signal, quietly (no KeyboardInterrupt traceback);
# only once that is set are the pids written, whole.
signal.signal(signal.SIGINT, signal.SIG_DFL)
pids, child = sys.argv[1:]
with open(pids + ".part", "w") as out:
    out.write(f"{{child}} {{os.getpid()}}")
os.replace(pids + ".part", pids)
time.sleep(600)
"""


def _hang_with_a_grandchild():
    pids = os.environ["{PIDS_ENV}"]
    subprocess.Popen([sys.executable, "-c", GRANDCHILD, pids, str(os.getpid())])
    while not os.path.exists(pids):  # the grandchild runs: now hang
        time.sleep(0.05)
    time.sleep(10**6)


hangs_with_a_grandchild = _on_trigger(_hang_with_a_grandchild)
aborts = _on_trigger(os.abort)
correct = _on_trigger(lambda: None)
exits_0 = _on_trigger(lambda: os._exit(0))
sys_exits_0 = _on_trigger(lambda: sys.exit(0))
reads_the_terminal = _on_trigger(input)
'''
EXITS_AT_IMPORT_MODULE = "exits_at_import_c128a_test"
EXITS_AT_IMPORT_SOURCE = """
import os

os._exit(0)  # as a native library calling exit(0) as it loads
"""


@pytest.fixture
def standin(tmp_path, monkeypatch) -> Path:
    """The stand-in targets importable here and in a replay's processes."""
    folder = tmp_path / "standin"
    folder.mkdir()
    (folder / f"{STANDIN_MODULE}.py").write_text(STANDIN_SOURCE)
    (folder / f"{EXITS_AT_IMPORT_MODULE}.py").write_text(EXITS_AT_IMPORT_SOURCE)
    return importable_here_and_in_children(folder, monkeypatch)


@pytest.fixture
def replay_pids(tmp_path):
    """The file the hanging target writes its pid and its grandchild's to;
    whatever of them is still running at the end is killed, by pid."""
    path = tmp_path / "pids"
    yield path
    if path.exists():
        for pid in map(int, path.read_text().split()):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def hang_case(tmp_path: Path) -> Path:
    path, _ = cases.write_case(
        make_case(property="matches_oracle", target="reference", kind="hang"), tmp_path / "hang"
    )
    return path


def good_file(tmp_path: Path) -> Path:
    """A matches_oracle case that passes on a correct target (not at the trigger)."""
    path, _ = cases.write_case(
        make_case(5, property="matches_oracle", target="reference"), tmp_path / "good"
    )
    return path


def start_replay(cli_process, *args, env: dict | None = None):
    """``c128a replay ARGS`` on the CPU as a process in its own session
    (:class:`helpers.CliProcess`); its output in files."""
    return cli_process("replay", *args, "--device", "cpu", env=env)


def running_pids(path: Path) -> list[int]:
    return [int(pid) for pid in path.read_text().split()]


# ---------------------------------------------------------------- what a replay leaves behind


def test_a_hang_replay_killed_at_its_timeout_leaves_no_process(tmp_path, standin, replay_pids,
                                                             cli_process):
    """The target hangs after starting a process of its own: at --timeout
    the child is killed with its process group, the grandchild too (before,
    the grandchild outlived the replay)."""
    replay = start_replay(cli_process, hang_case(tmp_path), "--target",
                          f"{STANDIN_MODULE}:hangs_with_a_grandchild", "--timeout", "10",
                          env={PIDS_ENV: str(replay_pids)})
    assert replay.wait(120) == EXIT_FAILED, replay.output()
    out, err = replay.output()
    assert "STILL HANGS: the hang case ran past --timeout=10 s" in out, (out, err)
    pids = running_pids(replay_pids)
    assert_all_ended(pids, 10, "the replay's child and the target's process still running")


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_replay_ends_its_child_and_the_targets_process(
    tmp_path, standin, replay_pids, signum, status, cli_process
):
    """SIGTERM or SIGINT to ``c128a replay`` while a hang case runs: passed
    on to the child's process group and waited for; the replay exits
    128 + signal and nothing of its child runs on (before, the parent died
    alone and its child ran on, seen 32 minutes later)."""
    replay = start_replay(cli_process, hang_case(tmp_path), good_file(tmp_path),
                          "--target", f"{STANDIN_MODULE}:hangs_with_a_grandchild",
                          env={PIDS_ENV: str(replay_pids)})
    wait_until(lambda: replay_pids.exists() and replay_pids.read_text(), 120,
               f"the hang case running in the replay's child: {replay.output()}")
    pids = running_pids(replay_pids)
    os.kill(replay.pid, signum)
    assert replay.wait(30) == status, replay.output()
    out, err = replay.output()
    assert f"interrupted by {signal.Signals(signum).name}" in err, (out, err)
    assert "PASSES now" not in out  # no file runs after the signal
    assert "Traceback" not in err
    assert_all_ended(pids, 10, "the replay's child and the target's process still running")


# ---------------------------------------------------------------- --timeout


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_replay_timeout_must_be_finite_and_positive(tmp_path, capsys, value):
    """A usage error (exit 2) naming the option, the value and the rule
    (before, inf was taken: a hang case would never be killed)."""
    status = cli.main(["replay", str(hang_case(tmp_path)), "--device", "cpu",
                       "--timeout", value])
    assert status == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--timeout={float(value)} must be a finite number of seconds > 0" in err, err


def test_replay_timeout_counts_from_the_start_of_the_case(tmp_path, standin, cli_process):
    """A hang case on a correct target whose child takes 8 s to start
    passes under --timeout 4: the clock starts when the child starts the
    case (before, start-up counted: PASSES never showed, STILL HANGS did)."""
    replay = start_replay(cli_process, hang_case(tmp_path), "--target",
                          f"{STANDIN_MODULE}:correct", "--timeout", "4",
                          env={SLOW_START_ENV: "1"})
    assert replay.wait(180) == EXIT_OK, replay.output()
    out, err = replay.output()
    assert "result:   PASSES now" in out and "STILL HANGS" not in out, (out, err)


# ---------------------------------------------------------------- a crash of a failure case


def test_a_failure_case_that_now_crashes_is_reported_and_the_next_file_runs(tmp_path, standin,
                                                                           cli_process):
    """A failure case whose target now aborts the process: with more than
    one case, each runs in a child, so that one is reported as crashing
    (exit 1) and the file after it still runs (before, the whole replay
    died of SIGABRT and the next file never ran)."""
    failure, _ = cases.write_case(
        make_case(property="matches_oracle", target="reference"), tmp_path / "failure"
    )
    good = good_file(tmp_path)
    replay = start_replay(cli_process, failure, good,
                          "--target", f"{STANDIN_MODULE}:aborts")
    assert replay.wait(180) == EXIT_FAILED, replay.output()
    out, err = replay.output()
    crashed = f"case:     {failure}\nresult:   STILL CRASHES: its child process died of SIGABRT"
    assert crashed in out, (out, err)
    after = out.split("STILL CRASHES")[1]
    assert f"case:     {good}" in after and "result:   PASSES now" in after, (out, err)


# ---------------------------------------------------------------- an end without a verdict


def failure_file(tmp_path: Path, kind: str = "failure") -> Path:
    """A matches_oracle case at the trigger, of ``kind``."""
    path, _ = cases.write_case(
        make_case(property="matches_oracle", target="reference", kind=kind), tmp_path / kind
    )
    return path


@pytest.mark.parametrize("kind, process", [("failure", "its process"),
                                           ("crash", "its child process")],
                         ids=["a failure case, in the command's process",
                              "a crash case, in its child"])
def test_a_target_ending_the_process_in_its_build_fails_the_replay(
    tmp_path, standin, cli_process, kind, process
):
    """The target calls os._exit(0) on the case's input (as a native library
    calling exit(0) would): the process running the case ends with status
    0 and no verdict, which is a failure of the replay, said in one line.
    (Before: the case printed its header and nothing more, and the replay
    exited 0: a crash case the fuzzer wrote for such a target replayed
    green.) With more than one case each runs in a child, as the crash case
    does here."""
    path = failure_file(tmp_path, kind)
    replay = start_replay(cli_process, path, "--target", f"{STANDIN_MODULE}:exits_0")
    assert replay.wait(180) == EXIT_FAILED, replay.output()
    out, err = replay.output()
    [line] = [line for line in out.splitlines() if "without a verdict" in line]
    assert line.startswith(f"result:   STILL CRASHES: {process} exited 0 while it ran the "
                           "case, without a verdict: the target ended the process itself "
                           "(os._exit(), exit() in a native library)"), (out, err)
    assert "PASSES" not in out, out


@pytest.mark.parametrize("kind", ["failure", "crash"],
                         ids=["in the command's process", "in its child"])
def test_a_target_ending_the_process_as_it_is_imported_fails_the_replay(
    tmp_path, standin, cli_process, kind
):
    """The target's module calls os._exit(0) as it is imported: the case
    cannot be replayed here (exit 2), said in one line; never exit 0 with
    no output. (Before: exit 0, nothing printed.)"""
    path = failure_file(tmp_path, kind)
    replay = start_replay(cli_process, path, "--target", f"{EXITS_AT_IMPORT_MODULE}:anything")
    assert replay.wait(180) == EXIT_USAGE, replay.output()
    out, err = replay.output()
    said = out + err
    assert "exited 0 while the case's target loaded, without a verdict: the target's import" in (
        said), (out, err)
    assert "PASSES" not in said


def test_a_target_raising_system_exit_fails_its_case(tmp_path, standin, capsys, c128a_device):
    """sys.exit(0) in the target's build, in the replay's own process: the
    case fails (exit 1), naming the SystemExit, and the replay goes on to
    print its verdict. (Before: the process ended with status 0.)"""
    status = cli.main(["replay", str(failure_file(tmp_path)), "--device", c128a_device.type,
                       "--target", f"{STANDIN_MODULE}:sys_exits_0"])
    out = capsys.readouterr().out
    assert status == EXIT_FAILED, out
    assert "result:   STILL FAILS" in out and "raised SystemExit(0) (sys.exit)" in out


def test_a_replays_own_child_option_needs_its_parent(tmp_path, capsys):
    """--in-process is how a replay runs its own child, whose parent holds
    its verdict: alone it would let a target's exit be the command's, so it
    is refused."""
    status = cli.main(["replay", str(good_file(tmp_path)), "--device", "cpu", "--in-process"])
    assert status == EXIT_USAGE
    assert "--in-process is the option of a replay's own child" in capsys.readouterr().err


def test_a_replay_in_a_terminal_keeps_it_for_the_target_and_ctrl_c(tmp_path, standin):
    """``c128a replay`` in the foreground of a terminal: the process running
    the case has the terminal (a target, or a debugger in it, reads from
    it), and Ctrl-C there reaches it once: one line and exit 130."""
    import pty

    path = failure_file(tmp_path)
    pid, terminal = pty.fork()
    if pid == 0:  # the child: a shell's foreground job on the new terminal
        try:
            os.execve(sys.executable, [sys.executable, "-m", "c128a.cli", "replay", str(path),
                      "--device", "cpu", "--target", f"{STANDIN_MODULE}:reads_the_terminal"],
                      child_environment(PACKAGE_ROOT, standin))
        finally:
            os._exit(127)
    output, done = b"", 0
    try:
        deadline = time.monotonic() + 120
        while b"inputs:" not in output and time.monotonic() < deadline:
            output += _read_some(terminal)
        assert b"inputs:" in output, output.decode(errors="replace")
        time.sleep(1.0)  # the target reads the terminal now, or is stopped for trying
        os.write(terminal, b"\x03")
        while not done and time.monotonic() < deadline:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            output += _read_some(terminal)
        assert done, f"the replay did not end: {output.decode(errors='replace')}"
    finally:
        if not done:
            os.killpg(pid, signal.SIGKILL)  # the child leads the terminal's session
            os.waitpid(pid, 0)
        output += _read_some(terminal)
        os.close(terminal)
    text = output.decode(errors="replace")
    assert os.waitstatus_to_exitcode(wait_status) == 130, text
    assert "c128a replay: interrupted by SIGINT; no further file runs" in text, text
    assert "Traceback" not in text and "without a verdict" not in text, text


def _read_some(terminal: int) -> bytes:
    readable, _, _ = select.select([terminal], [], [], 0.2)
    if not readable:
        return b""
    try:
        return os.read(terminal, 1 << 16)
    except OSError:  # the terminal's other end is closed
        return b""
