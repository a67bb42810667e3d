"""HeldSignals: the one way the command line, a replay and a fuzz run take
signals over, and give them back."""

from __future__ import annotations

import signal
import threading

from c128a.interrupts import HeldSignals


def _mine(signum, frame=None):
    pass


def test_held_signals_come_back_as_they_were():
    before = signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)
    with HeldSignals(_mine, (signal.SIGHUP, signal.SIGTERM)) as held:
        assert signal.getsignal(signal.SIGHUP) is _mine
        assert signal.getsignal(signal.SIGTERM) is _mine
    assert (signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)) == before
    held.restore()  # a second restore changes nothing
    assert (signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)) == before


def test_outside_the_main_thread_nothing_is_held():
    """Python runs handlers in the main thread only, and refuses to install
    one elsewhere: a run driven from another thread keeps its handlers."""
    before = signal.getsignal(signal.SIGHUP)
    found = []

    def elsewhere():
        with HeldSignals(_mine, (signal.SIGHUP,)) as held:
            found.append((held.previous, signal.getsignal(signal.SIGHUP)))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert found == [({}, before)]
