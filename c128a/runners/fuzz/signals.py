"""SIGINT, SIGTERM and SIGHUP in every phase of a fuzz run.

A run has phases: start-up (loading the target, checking paths, before any
worker), the rounds (the supervisor's own handler stops the run like its
deadline, :meth:`~.supervisor.Supervisor.interrupt`), then the end (the
report written, the summary printed). :class:`RunSignals` holds the
handler outside the rounds: at start-up a signal raises
:class:`RunInterrupted` (nothing ran, so one line says there is no report);
at the end it raises it too, cutting the summary short (a write to a
stderr nobody reads blocks for ever), and the run then writes its report
marked interrupted; from there on a signal is only noted, so that the
report's last write completes. Before, a signal outside the rounds met the
default handler: exit 143, nothing printed, no report.
"""

from __future__ import annotations

import signal

from ...interrupts import HeldSignals

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops a run like its deadline: Ctrl-C, a kill, a closed terminal or SSH session."""


class RunInterrupted(BaseException):
    """A stop signal outside the rounds. A BaseException: nothing that
    handles a target's or a file's errors mistakes it for one."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return describe_signal(self.signum).removeprefix("signal ")


class RunSignals:
    """The stop signals' handler from a run's start to its end (in the main
    thread only: elsewhere Python runs no handler). Used as a context
    manager; the previous handlers come back at its exit."""

    def __init__(self):
        self.received: int | None = None  # the first stop signal outside the rounds
        self.raising = True
        self.delegate = None  # during the rounds: the supervisor's own handler
        self.held: HeldSignals | None = None

    def __enter__(self) -> RunSignals:
        self.held = HeldSignals(self.handle, STOP_SIGNALS)
        return self

    def __exit__(self, *exc_info) -> None:
        self.held.restore()

    def handle(self, signum: int, frame=None) -> None:
        if self.delegate is not None:
            self.delegate(signum, frame)
            return
        if self.received is None:
            self.received = signum
        if self.raising:
            raise RunInterrupted(signum)

    def only_note(self) -> None:
        """From now on a signal is noted, not raised: the report's last write
        must complete."""
        self.raising = False


def describe_signal(signum: int) -> str:
    """``signal SIGKILL``; a signal without a name in :class:`signal.Signals`
    (a real-time one) by its number and its place after SIGRTMIN, e.g.
    ``signal 37, SIGRTMIN+3``."""
    try:
        return f"signal {signal.Signals(signum).name}"
    except ValueError:
        pass
    first, last = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if first is not None and last is not None and first < signum < last:
        return f"signal {signum}, SIGRTMIN+{signum - first}"
    return f"signal {signum}"
