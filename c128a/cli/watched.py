"""A process running a target's code, and its parent, which holds its verdict.

The code a replay runs (a target's import, its build) may end the process
itself: ``os._exit(0)``, or ``exit()`` in a native library. The process then
ends with the status that code chose, 0 included, having printed no verdict,
and a shell or CI reads a pass. So no process that runs a target's code
decides the exit status of ``c128a replay``: it tells its parent, through a
pipe, what it is doing and, at its normal end, its verdict (:class:`Marks`);
a process that ends without telling its verdict has failed, and its parent
says so in one line (:func:`judge`).

Two kinds of process run a target's code. A replay's child (``c128a replay
... --in-process``, :func:`c128a.cli.replay.run_child`), which runs one case
under a time limit. And, for a case the replay runs itself, ``c128a
replay`` as a command: it forks before it imports anything of weight
(:func:`run_watched`); the forked process runs the command as it always
did, and the first one waits for it, passing on the signals it gets. The
forked process leads a process group of its own, the terminal's foreground
one while it runs where the command had the terminal, so that Ctrl-C, a
debugger's prompt and Ctrl-Z reach it as they reached the command.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Callable

from ..failures import EXIT_FAILED, EXIT_USAGE
from ..interrupts import HeldSignals

WATCHED_COMMANDS = ("replay",)
"""The subcommands run as a forked process whose verdict its parent holds."""
CHILD_OPTION = "--in-process"
"""The option of a replay's own child: its parent holds its verdict already."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals the parent passes on to the process it watches."""
PR_SET_PDEATHSIG = 1  # prctl option: a signal for this process when its parent dies

LOADING, STARTED, ENDED, VERDICT = "loading", "started", "ended", "verdict"
"""The marks: a case's target is loading; the case started; the case ended;
the process's exit status, written as it ends the normal way."""


# ---------------------------------------------------------------- the side that runs the code


_channel: int | None = None  # the pipe to the parent, where this process is watched


def attach(fd: int) -> None:
    """This process is watched: its marks go to ``fd``."""
    global _channel
    _channel = fd


def tell_parent(mark: str, detail: object = "") -> None:
    """Write ``mark`` (and ``detail``) for the parent, where there is one,
    after what this process printed so far (which a process that ends by
    ``os._exit`` would otherwise lose)."""
    if _channel is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    line = f"{mark} {detail}".rstrip().replace("\n", " ") + "\n"
    try:
        os.write(_channel, line.encode(errors="replace"))
    except OSError:  # the parent is gone: the death signal ends this process too
        pass


# ---------------------------------------------------------------- the side that judges


@dataclass
class Marks:
    """What a watched process told its parent, read from the pipe as it comes."""

    lines: list[str] = field(default_factory=list)
    partial: bytes = b""

    def feed(self, data: bytes) -> None:
        text = self.partial + data
        *complete, self.partial = text.split(b"\n")
        self.lines += [line.decode(errors="replace") for line in complete]

    def read_available(self, fd: int) -> None:
        """Everything the pipe holds now, without waiting (a process the
        target started may hold its other end open)."""
        blocking = os.get_blocking(fd)
        os.set_blocking(fd, False)
        try:
            while data := os.read(fd, 1 << 16):
                self.feed(data)
        except BlockingIOError:
            pass
        finally:
            os.set_blocking(fd, blocking)

    def last(self, *marks: str) -> tuple[str, str] | None:
        """The last (mark, detail) among ``marks``."""
        for line in reversed(self.lines):
            mark, _, detail = line.partition(" ")
            if mark in marks:
                return mark, detail
        return None

    @property
    def verdict(self) -> int | None:
        found = self.last(VERDICT)
        try:
            return int(found[1]) if found else None
        except ValueError:
            return None

    @property
    def started(self) -> bool:
        return self.last(STARTED) is not None


def status_name(returncode: int) -> str:
    """``exited N`` or ``died of SIGNAME``, for a process's return code
    (``subprocess``'s: negative for a signal)."""
    if returncode >= 0:
        return f"exited {returncode}"
    try:
        return f"died of {signal.Signals(-returncode).name}"
    except ValueError:  # a signal without a name (SIGRTMIN + n)
        return f"died of signal {-returncode}"


@dataclass(frozen=True)
class Judgement:
    """A watched process's end as the replay counts it: ``status`` (the exit
    status it stands for), ``case`` (the case it ran when it ended, if any)
    and ``line`` (what to say; None: the process told its verdict and ended
    with it)."""

    status: int
    line: str | None = None
    case: str | None = None
    in_case: bool = False  # it ended while the case ran


def judge(returncode: int, marks: Marks, *, failed: int, unreplayable: int,
          process: str = "its process") -> Judgement:
    """How a watched process's end counts. Its verdict, where it told one
    and ended with it. Else, without one: ended while a case ran, the target
    ended the process (exit ``failed``, as a crash does); while a case's
    target loaded, or outside any case, nothing was replayed (exit
    ``unreplayable``). A verdict told, then another end: the worse of the two.
    ``process`` names the process in the line said."""
    verdict = marks.verdict
    how = status_name(returncode)
    if verdict is not None:
        if returncode == verdict:
            return Judgement(verdict)
        return Judgement(verdict or failed, f"{process} told its verdict (exit {verdict}), "
                         f"then {how}: code run as the interpreter ended (an atexit handler, a "
                         "native library's destructor) ended it")
    ended_it = ("the target crashed the process" if returncode < 0 else
                "the target ended the process itself (os._exit(), exit() in a native library) "
                "instead of returning")
    where = marks.last(LOADING, STARTED, ENDED)
    if where is not None and where[0] == STARTED:
        return Judgement(failed, f"{process} {how} while it ran the case, without a verdict: "
                         f"{ended_it}; counted as a crash, never a pass", case=where[1],
                         in_case=True)
    if where is not None and where[0] == LOADING:
        return Judgement(unreplayable, f"{process} {how} while the case's target loaded, "
                         "without a verdict: the target's import (or a native library it "
                         "loads) ended the process; the case cannot be replayed here",
                         case=where[1])
    when = "after its last case" if where is not None else "before it ran any case"
    return Judgement(unreplayable, f"{process} {how} {when}, without a verdict: what it "
                     "imported (a target's or --properties' module, a native library) or a "
                     "signal ended it; nothing it did counts as a pass")


# ---------------------------------------------------------------- the command, forked


def watches(argv: list[str]) -> bool:
    """Whether the command line ``argv`` (without the program) runs forked
    and watched: a subcommand of :data:`WATCHED_COMMANDS`, unless it is a
    replay's own child."""
    return bool(argv) and argv[0] in WATCHED_COMMANDS and CHILD_OPTION not in argv


def run_watched(body: Callable[[], int], name: str) -> int:
    """Run ``body`` (the command) in a forked process and return the exit
    status this process should end with; in the forked process, return
    ``body``'s status after telling it. ``name`` (``c128a replay``) starts
    the lines this process prints."""
    read, write = os.pipe()
    terminal = _foreground_terminal()
    sys.stdout.flush()
    sys.stderr.flush()
    # Blocked across the fork: the parent passes them on once it can, the
    # child takes them once it leads its own group.
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _become_watched(parent, terminal)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        attach(write)
        try:
            status = body()
        except SystemExit as exc:  # argparse's --help and usage errors end the command so
            status = _exit_status(exc)
        tell_parent(VERDICT, status)
        return status
    os.close(write)
    try:
        os.setpgid(pid, pid)  # also here: whichever of the two runs first
    except OSError:
        pass
    forward = HeldSignals(lambda signum, frame: _signal_group(pid, signum), FORWARDED)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    marks = Marks()
    try:
        returncode = _wait(pid, terminal)
    finally:
        forward.restore()
        if terminal is not None:
            _give_terminal(terminal, os.getpgrp())
    marks.read_available(read)
    os.close(read)
    judged = judge(returncode, marks, failed=EXIT_FAILED, unreplayable=EXIT_USAGE)
    if judged.in_case:
        # The case's block on stdout ends with its result, as a replay's
        # child's does; a crash ends the command with the signal's status,
        # as the shell saw it before the watch.
        print(f"result:   STILL CRASHES: {judged.line}\n", flush=True)
        return 128 - returncode if returncode < 0 else judged.status
    if judged.line is not None:
        case = f" {judged.case}:" if judged.case else ""
        print(f"{name}:{case} {judged.line}", file=sys.stderr, flush=True)
    return judged.status


def _exit_status(exc: SystemExit) -> int:
    """The status Python exits with for ``exc``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _foreground_terminal() -> int | None:
    """stdin's terminal, where this process's group is its foreground one
    (the command runs in the foreground of a shell); else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _give_terminal(terminal: int, group: int) -> None:
    """Make ``group`` the terminal's foreground group (from any group: a
    background one would be stopped by SIGTTOU for trying)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(terminal, group)
    except OSError:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _become_watched(parent: int, terminal: int | None) -> None:
    """The forked process: its own process group (the terminal's foreground
    one where the command had the terminal), and ended by SIGTERM should its
    parent die (Linux), so that it never runs on alone."""
    os.setpgid(0, 0)
    if terminal is not None:
        _give_terminal(terminal, os.getpgrp())
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the death signal was set
        os._exit(128 + signal.SIGTERM)


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):  # the group has ended
        pass


def _wait(pid: int, terminal: int | None) -> int:
    """Wait for the forked process to end: its return code (negative: the
    signal it died of). Stopped (Ctrl-Z in the terminal it was given), this
    process stops too, so that the shell sees its job stopped, and on its
    way again takes the forked process with it."""
    while True:
        _, wait_status = os.waitpid(pid, os.WUNTRACED)
        if not os.WIFSTOPPED(wait_status):
            return os.waitstatus_to_exitcode(wait_status)
        if terminal is not None:
            _give_terminal(terminal, os.getpgrp())
        os.kill(os.getpid(), signal.SIGSTOP)
        if terminal is not None:
            _give_terminal(terminal, pid)
        _signal_group(pid, signal.SIGCONT)
