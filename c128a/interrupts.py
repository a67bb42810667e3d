"""Signal handlers held for a while and given back: the one way the command
line, a replay and a fuzz run take SIGINT, SIGTERM and SIGHUP over.

Python runs a handler in the main thread only, and installing one anywhere
else raises; :class:`HeldSignals` installs nothing there (a run driven
from another thread keeps the handlers it has). Imports nothing of c128a.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable


class HeldSignals:
    """``handler`` for each of ``signums`` from now (in the main thread),
    the previous handlers back at :meth:`restore`, which leaving a ``with``
    block calls."""

    def __init__(self, handler: Callable, signums: Iterable[int]):
        self.previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, handler) for signum in signums}

    def restore(self) -> None:
        previous, self.previous = self.previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def __enter__(self) -> HeldSignals:
        return self

    def __exit__(self, *exc_info) -> None:
        self.restore()
