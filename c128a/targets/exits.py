"""Code that ends the process before the run has finished.

A process that ends cannot report: a target whose import or build calls
``os._exit(0)``, or a native library of it calling C ``exit(0)``, would end
a run with status 0 and nothing said, which reads as a pass. While a run is
under way (:func:`guard`, until its :meth:`RunGuard.finish`):

- ``os._exit(status)`` called in the process's main thread raises
  :class:`ExitCalled` instead (an ``Exception``): the target's fault, reported
  where it was called (a build: :class:`~c128a.failures.TargetRaised`; a
  module's import: a target that does not load). In another thread (a
  timeout's own watchdog) it ends the process as asked, after one line when
  the status is 0.
- C ``exit()``, which no Python code sees, runs the C-level exit handler this
  module registers (glibc's ``__cxa_atexit``, through ctypes): one line on
  the standard error saying what was running, then the process ends with
  the run's status for that case (non-zero).

A forked child of the guarded process is not guarded (it ends as it asks).
When the run finishes the handler is taken back (``__cxa_finalize``) while
Python still runs: a ctypes callback called after the interpreter has shut
down would crash the process.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from dataclasses import dataclass, field

_REAL_EXIT = os._exit


class ExitCalled(Exception):
    """``os._exit(status)`` called while a run was under way, in its main
    thread: refused, since a process that ends cannot report."""

    def __init__(self, status: int, during: str):
        self.status, self.during = status, during
        super().__init__(
            f"os._exit({status}) called during {during}, before the run finished: a process "
            "that ends cannot report, so the call is refused; return or raise instead")

    def __reduce__(self):
        return (type(self), (self.status, self.during))


@dataclass
class RunGuard:
    """The guard of one run: what it calls itself in messages (``run``),
    what runs now (``during``) and the status the process ends with when
    native code ends it then (``status``). Nested runs (pytest's pytester
    running pytest in the process) each have one; the innermost speaks."""

    run: str
    during: str
    status: int
    finished: bool = field(default=False)

    def doing(self, during: str, status: int | None = None) -> None:
        """Now running ``during``; a native exit then ends with ``status``."""
        self.during = during
        if status is not None:
            self.status = int(status)

    def finish(self) -> None:
        """The run is over: what it guarded may end the process again."""
        _release(self)


_runs: list[RunGuard] = []
_owner_pid: int | None = None
_stderr_fd: int | None = None
_native: "_NativeHandler | None" = None
_lock = threading.Lock()


def guard(run: str, during: str, status: int) -> RunGuard:
    """Guard the process while run ``run`` is under way (see the module)."""
    global _owner_pid, _stderr_fd, _native
    with _lock:
        if _owner_pid != os.getpid():  # the first run, or the first in a forked child
            _runs.clear()
            _owner_pid = os.getpid()
            if _stderr_fd is not None:
                os.close(_stderr_fd)
            # The standard error as it is now: while a test runs, pytest's
            # capture points fd 2 at a file that dies with the process.
            _stderr_fd = os.dup(2)
            os._exit = _guarded_exit
            _native = _NativeHandler.register()
            atexit.register(_release_all)
        run_guard = RunGuard(run, during, int(status))
        _runs.append(run_guard)
        return run_guard


def _release(run_guard: RunGuard) -> None:
    with _lock:
        run_guard.finished = True
        if run_guard in _runs:
            _runs.remove(run_guard)
        if not _runs and _owner_pid == os.getpid():
            _unguard()


def _release_all() -> None:
    with _lock:
        _runs.clear()
        _unguard()


def _unguard() -> None:
    global _native, _owner_pid
    if os._exit is _guarded_exit:
        os._exit = _REAL_EXIT
    if _native is not None:
        _native.unregister()
        _native = None
    _owner_pid = None


def guarded() -> RunGuard | None:
    """The innermost run under way in this process, None when none is."""
    return _runs[-1] if _runs and _owner_pid == os.getpid() else None


def report_fd() -> int:
    """Where this module's lines go: the standard error as the first run
    found it (pytest's capture may point fd 2 elsewhere while a test runs)."""
    return _stderr_fd if _stderr_fd is not None and _owner_pid == os.getpid() else 2


def end_process(line: str, status: int) -> None:
    """Say ``line`` (see :func:`_say`) and end the process with ``status``
    at once, whatever is guarded: a watchdog's way out of a check stuck in
    native code."""
    _say(line)
    _REAL_EXIT(int(status))


def _say(line: str) -> None:
    """One line on the standard error the run started with, after what
    Python has buffered for the terminal."""
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing to flush
            pass
    try:
        os.write(report_fd(), (line + "\n").encode())
    except OSError:
        pass


def _guarded_exit(status: int) -> None:
    run_guard = guarded()
    if run_guard is None:
        _REAL_EXIT(status)
    if threading.current_thread() is threading.main_thread():
        raise ExitCalled(status, run_guard.during)
    if status == 0:
        _say(f"c128a: os._exit(0) called in thread {threading.current_thread().name!r} during "
             f"{run_guard.during}, before {run_guard.run} finished: {run_guard.run} did not "
             f"finish, so it is not a pass (exit status {run_guard.status})")
        status = run_guard.status
    _REAL_EXIT(status)


def _on_native_exit(_argument) -> None:
    """The C-level exit handler: runs in C ``exit()``, with Python alive."""
    run_guard = guarded()
    if run_guard is None:
        return  # the run finished (this is its release), or a forked child
    _say(f"c128a: the process called exit() (C; native code, such as a library the target "
         f"loads) during {run_guard.during}, before {run_guard.run} finished: {run_guard.run} "
         f"did not finish, so it is not a pass (exit status {run_guard.status})")
    _REAL_EXIT(run_guard.status)


_HANDLER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_HANDLER = _HANDLER_TYPE(_on_native_exit)  # kept alive for the process's life


class _NativeHandler:
    """:func:`_on_native_exit` registered with the C library's exit handlers
    under a token of its own, so that it can be taken back alone."""

    def __init__(self, finalize, token):
        self.finalize, self.token = finalize, token

    @classmethod
    def register(cls) -> "_NativeHandler | None":
        try:
            libc = ctypes.CDLL(None)
            # By name: in a class body ``libc.__cxa_atexit`` would be mangled.
            register, finalize = getattr(libc, "__cxa_atexit"), getattr(libc, "__cxa_finalize")
        except (OSError, AttributeError):  # no C library of that kind: Python's guard alone
            return None
        register.argtypes = (_HANDLER_TYPE, ctypes.c_void_p, ctypes.c_void_p)
        finalize.argtypes = (ctypes.c_void_p,)
        token = ctypes.create_string_buffer(1)  # a unique address: the handler's "library"
        if register(_HANDLER, None, ctypes.addressof(token)) != 0:
            return None
        return cls(finalize, token)

    def unregister(self) -> None:
        """Run the handler now, which does nothing once the run is over, so
        that the C library forgets it."""
        self.finalize(ctypes.addressof(self.token))
