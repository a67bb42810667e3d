"""The run's temporary folder (``$TMPDIR/c128a-fuzz-PID-*``): the workers'
in-flight files, and the workers' own temporary files (their
``tempfile.tempdir``), so that what a killed worker was writing goes with
the folder.

The supervisor removes it at the run's end. A supervisor killed outright
(SIGKILL, the out-of-memory killer) cannot: its workers die with it (they
watch their parent), and the folder stays. So each folder holds an owner
file (:data:`OWNER_FILE`: the supervisor's pid and pid namespace), and each
run, when it starts, removes the folders of owners that are gone
(:func:`remove_stale_run_dirs`): same namespace, pid not running, or
running another program since. A folder without an owner file (being made,
or of an older c128a) is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "c128a-fuzz-"
OWNER_FILE = "owner.json"


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot; Linux), to tell
    it from a later process given the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def make_run_dir() -> Path:
    """A new run folder with its owner file."""
    return claim(Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")))


def claim(folder: Path) -> Path:
    """Write ``folder``'s owner file: this process."""
    owner = {"pid": os.getpid(), "pid_namespace": _pid_namespace(), "started": _started(os.getpid())}
    (folder / OWNER_FILE).write_text(json.dumps(owner))
    return folder


def remade(folder: Path) -> bool:
    """Make ``folder`` again, owned by this process, if something deleted it
    (a temporary-file cleaner, a hand); whether it had to."""
    if folder.is_dir():
        return False
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    claim(folder)
    return True


def pid_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists (one this process may not signal
    exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def owner_gone(folder: Path) -> bool:
    """Whether ``folder``'s owner has ended, as far as this process can tell."""
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
        pid = int(owner["pid"])
    except (OSError, ValueError, TypeError, KeyError):
        return False
    if owner.get("pid_namespace") != _pid_namespace():
        return False  # another container's run: its pids are not ours to judge
    if pid_gone(pid):
        return True
    return owner.get("started") is not None and _started(pid) != owner.get("started")


def remove_stale_run_dirs(root: Path | str | None = None) -> list[Path]:
    """Remove the run folders under ``root`` (the temporary folder) whose
    owner is gone; the folders removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if folder.is_dir() and not folder.is_symlink() and owner_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
