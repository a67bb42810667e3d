"""Where an example's time goes: named phases the harness reports to.

The harness marks its phases (``with phase("oracle"):``, or ``@measured``);
they cost one global lookup while no clock runs. A runner that wants the
split (``c128a fuzz``'s summary, ``c128a bench --throughput``) runs a
:class:`PhaseClock`, which adds each phase's *own* time (the phases entered
inside it excluded) to its totals.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import Counter
from typing import Callable, Iterator

PHASES = ("draw", "tensors", "buffers", "validation", "target", "oracle", "comparison", "other")
"""The phases, in the order reports list them: Hypothesis drawing the step
(everything outside the check), the step's tensors, poisoned buffers, the
contract's argument checks, the target's build (its checks excluded), the
oracle's expected values, comparing with them, and the rest of the check."""

_running: "PhaseClock | None" = None


class PhaseClock:
    """Exclusive wall time per phase while it runs (``with PhaseClock():``).

    ``sync`` (``torch.cuda.synchronize`` on a GPU) is called at the end of
    every phase, so that asynchronous device work is charged to the phase
    that launched it; without it, device time lands where the host waits.
    """

    def __init__(self, sync: Callable[[], None] | None = None):
        self.sync = sync
        self.totals: Counter[str] = Counter()
        self._stack: list[list] = []  # [name, start, time spent in nested phases]

    def __enter__(self) -> "PhaseClock":
        global _running
        self._outer, _running = _running, self
        return self

    def __exit__(self, *exc_info) -> None:
        global _running
        _running = self._outer

    def reset(self) -> None:
        self.totals.clear()

    def start(self, name: str) -> None:
        self._stack.append([name, time.perf_counter(), 0.0])

    def stop(self) -> None:
        if self.sync is not None:
            self.sync()
        name, start, nested = self._stack.pop()
        elapsed = time.perf_counter() - start
        self.totals[name] += elapsed - nested
        if self._stack:
            self._stack[-1][2] += elapsed


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Charge the time inside the block to phase ``name``."""
    clock = _running
    if clock is None:
        yield
        return
    clock.start(name)
    try:
        yield
    finally:
        clock.stop()


def measured(name: str):
    """Decorate a function so that its calls are charged to phase ``name``."""

    def decorate(function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            clock = _running
            if clock is None:
                return function(*args, **kwargs)
            clock.start(name)
            try:
                return function(*args, **kwargs)
            finally:
                clock.stop()

        return timed

    return decorate
