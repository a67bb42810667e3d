"""Every process a fuzz run starts ends with it, sessions of their own included.

A worker leads a process group, and the supervisor ends a worker by killing
that group (:func:`~.process.kill_group`); but a process the target starts
in a session of its own (``setsid``, ``start_new_session=True``, a daemon's
double fork) leaves the group, and outlived the run. So, on Linux:

- the supervisor is a child subreaper while it runs (:class:`Strays`,
  ``PR_SET_CHILD_SUBREAPER``): a process orphaned anywhere below it (by a
  worker that died, or that was killed) is given to it rather than to init,
  and it ends and reaps each such process (:meth:`Strays.sweep`) after a
  worker ends and at the run's end;
- each worker is a subreaper too (:func:`become_subreaper`): while it runs,
  what its target orphans stays below it, and the supervisor ends the
  worker's whole tree, found under ``/proc``, with its group
  (:func:`end_tree`).

Elsewhere (no ``/proc``, no ``prctl``) only the process group is ended.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # prctl option: orphans below this process come to it
REAP_WAIT_S = 2.0  # a SIGKILLed process is gone at once; past this, one in the D state is left


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper(on: bool = True) -> bool:
    """Make this process a child subreaper (or stop being one); whether it could."""
    return _prctl(PR_SET_CHILD_SUBREAPER, int(on))


def parent_table() -> dict[int, int]:
    """pid -> parent pid of every process under ``/proc`` now (empty elsewhere)."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            table[int(name)] = int(fields[1])
    return table


def children_of(pid: int, table: dict[int, int] | None = None) -> set[int]:
    table = parent_table() if table is None else table
    return {child for child, parent in table.items() if parent == pid}


def descendants_of(pid: int, table: dict[int, int] | None = None) -> set[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    table = parent_table() if table is None else table
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in table.items() if parent in frontier} - found
        found |= frontier
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_tree(pid: int) -> None:
    """SIGKILL every process below ``pid`` (``pid`` itself is the caller's to
    end), again until none is left: one may fork while the first are killed."""
    for _ in range(10):
        below = descendants_of(pid)
        if not below:
            return
        for child in below:
            _kill(child)


def _reap(pid: int) -> None:
    """Wait for ``pid``, a child of this process that was killed (no zombie stays)."""
    ends = time.monotonic() + REAP_WAIT_S
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > ends:
            return
        time.sleep(0.01)


class Strays:
    """The supervisor's side: from :meth:`adopt` to :meth:`release` this
    process is a child subreaper, and :meth:`sweep` ends (and reaps) every
    child it has gained since, except the ones it started itself (the fork
    server: :meth:`keep_children_now` right after starting it) and their
    trees."""

    def __init__(self):
        self.pid = os.getpid()
        self.before: set[int] = set()  # children it had before (not the run's)
        self.kept: set[int] = set()  # children the run started itself
        self.on = False

    def keep_children_now(self) -> None:
        """The children gained since :meth:`adopt` are the run's own (called
        right after its first process from the fork server started, which
        started the fork server: nothing was orphaned yet)."""
        self.kept |= children_of(self.pid) - self.before

    def adopt(self) -> None:
        self.before = children_of(self.pid)
        self.on = become_subreaper(True)

    def release(self) -> None:
        if self.on:
            become_subreaper(False)
            self.on = False

    def sweep(self) -> set[int]:
        """End every process given to this one since :meth:`adopt` (orphans of
        the run's workers), with whatever each started; the pids ended."""
        if not self.on:
            return set()
        ended: set[int] = set()
        for _ in range(10):
            table = parent_table()
            strays = children_of(self.pid, table) - self.before - self.kept
            if not strays:
                break
            for stray in strays:
                for below in descendants_of(stray, table):
                    _kill(below)
                _kill(stray)
            for stray in strays:
                _reap(stray)
            ended |= strays
        return ended
