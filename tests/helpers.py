"""What the machinery tests (CLI, fuzz, replay, cases, bench) share: the
``c128a`` command as a child process, the process table under /proc, short
temporary folders for the fuzz workers' sockets, stand-in targets' source,
paths that are not what an option wants, and real small or full file
systems.

Imported by name (``from helpers import ...``), as the tests import their
other siblings (``fault_targets``); fixtures built on these are in
``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import c128a
from c128a.options import DEVICE_ENV

PACKAGE_ROOT = Path(c128a.__file__).resolve().parent.parent
"""The folder holding the c128a package the tests import: its children import the same."""
TESTS = Path(__file__).parent


# ---------------------------------------------------------------- stand-in targets


def on_trigger_source(trigger: int) -> str:
    """Source of ``_on_trigger(action)``, for a stand-in target module: a
    target that calls ``action()`` when a step's first position is
    ``trigger`` (the position a test's case holds), and is the oracle
    otherwise. The module must import ``oracle`` and ``SimpleNamespace``."""
    return f'''
def _on_trigger(action):
    def build_c128a_topk_metadata(*args):
        if int(args[0][0]) == {trigger}:
            action()
        return oracle.build_c128a_topk_metadata(*args)

    return SimpleNamespace(build_c128a_topk_metadata=build_c128a_topk_metadata)
'''


def importable_here_and_in_children(folder: Path, monkeypatch) -> Path:
    """``folder``'s modules importable in this process (``sys.path``) and in
    the child processes it starts (``$PYTHONPATH``), until the test ends."""
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", python_path(folder, package=False))
    return folder


# ---------------------------------------------------------------- the command as a child


def python_path(*folders: Path | str, package: bool = True) -> str:
    """``$PYTHONPATH`` for a child: ``folders``, this checkout (``package``),
    then what this process has."""
    entries = [*map(str, folders), *([str(PACKAGE_ROOT)] if package else []),
               os.environ.get("PYTHONPATH")]
    return os.pathsep.join(filter(None, entries))


def cli_command(*args) -> list[str]:
    """``python -m c128a.cli ARGS`` with this interpreter."""
    return [sys.executable, "-m", "c128a.cli", *map(str, args)]


def child_environment(*folders: Path | str, **variables: str) -> dict[str, str]:
    """This environment for a child that imports this checkout's c128a (and
    ``folders``' modules) and runs kernels under Triton's interpreter, on the
    CPU even where the session's ``$C128A_DEVICE`` names CUDA (which the
    interpreter refuses)."""
    return {**os.environ, "PYTHONPATH": python_path(*folders), "TRITON_INTERPRET": "1",
            DEVICE_ENV: "cpu", **variables}


def run_cli(*args, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """``c128a ARGS`` as a child process in ``cwd``, run to its end; killed
    past ``timeout`` (TimeoutExpired: it hung)."""
    return subprocess.run(cli_command(*args), cwd=cwd, capture_output=True, text=True,
                          env=child_environment(), timeout=timeout)


class CliProcess:
    """``c128a ARGS`` as a child process in a session of its own (a signal
    to its group reaches everything it started), its output in
    ``folder/stdout.txt`` and ``folder/stderr.txt``."""

    def __init__(self, folder: Path, *args, path: tuple = (), env: dict | None = None):
        self.folder = folder
        self.command = str(args[0]) if args else ""
        self.stdout = open(folder / "stdout.txt", "w+")
        self.stderr = open(folder / "stderr.txt", "w+")
        self.process = subprocess.Popen(
            cli_command(*args), env=child_environment(*path, **(env or {})),
            stdout=self.stdout, stderr=self.stderr, start_new_session=True,
        )
        self.pid = self.process.pid

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) so far."""
        self.stdout.flush()
        self.stderr.flush()
        return (self.folder / "stdout.txt").read_text(), (self.folder / "stderr.txt").read_text()

    def errors(self) -> str:
        return self.output()[1]

    def wait_for_error(self, text: str, timeout: float) -> None:
        """Until ``text`` is in its standard error; the test fails at once,
        with its output, when it ends first, and past ``timeout``."""

        def printed() -> bool:
            status = self.process.poll()
            if text in self.errors():
                return True
            if status is not None:
                raise AssertionError(f"c128a {self.command} ended ({status}) before printing "
                                     f"{text!r}: {self.output()}")
            return False

        wait_until(printed, timeout,
                   lambda: f"c128a {self.command} has not printed {text!r}: {self.output()}")

    def wait(self, timeout: float) -> int:
        """Its exit status; past ``timeout`` its group is killed and the test fails."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(f"c128a {self.command} did not end within {timeout:g} s: "
                                 f"{self.output()}") from None

    def close(self) -> None:
        """Kill its group if it still runs; close its output files."""
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait()
        self.stdout.close()
        self.stderr.close()


def short_temporary_folder() -> Path:
    """A new folder under /tmp with a short name, for a child's ``$TMPDIR``:
    the fuzz workers' fork server binds a Unix socket there (108 bytes at
    most), and pytest's ``tmp_path`` grows past that. The caller removes it."""
    return Path(tempfile.mkdtemp(prefix="c128a-t", dir="/tmp"))


# ---------------------------------------------------------------- processes (/proc)

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="follows processes through /proc (Linux)")


def parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[int(entry.name)] = int(fields[1])
    return found


def descendants(pid: int) -> set[int]:
    table = parents()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in table.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ps(pids) -> str:
    """``ps``-like lines of those still running, for a failure message."""
    lines = []
    for pid in sorted(pids):
        if alive(pid):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            lines.append(f"{pid} {command[:120]}")
    return "\n".join(lines) or "(none)"


def wait_until(condition, timeout: float, what, interval: float = 0.1):
    """``condition()``'s first true value; an AssertionError naming ``what``
    (a text, or a function giving it then) when none comes within
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"after {timeout:g} s: {what() if callable(what) else what}")


def assert_all_ended(pids, timeout: float = 10.0, what: str = "processes still running") -> None:
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout, f"{what}:\n{ps(pids)}")


# ---------------------------------------------------------------- paths and ports


def free_port() -> int:
    """A local TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def a_file(tmp_path: Path, name: str = "a-file") -> Path:
    """A regular file, where a folder is wanted."""
    path = tmp_path / name
    path.write_text("x")
    return path


def a_fifo(tmp_path: Path, name: str) -> Path:
    """A named pipe, where a regular file is wanted (opening it would wait)."""
    path = tmp_path / name
    os.mkfifo(path)
    return path


# ---------------------------------------------------------------- real small and full file systems


@contextlib.contextmanager
def small_tmpfs(mount_point: Path):
    """A real 64 KiB tmpfs at ``mount_point`` (made here), unmounted after;
    the test is skipped where mounting is not permitted."""
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill_to_the_last_byte(folder: Path) -> None:
    """Fill ``folder``'s file system with one file until a write fails with
    ENOSPC: creating a file there still works, writing a byte does not."""
    filler = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as full:
            while True:
                os.write(filler, b"x" * 4096)
    finally:
        os.close(filler)
    assert full.value.errno == errno.ENOSPC
