"""Where an example's time goes: named phases the harness reports to.

The harness marks its phases (``with phase("oracle"):``, or ``@measured``);
they cost one global lookup while no clock runs. A runner that wants the
split (``c128a fuzz``'s summary, ``c128a bench --throughput``) runs a
:class:`PhaseClock`, which adds each phase's *own* time (the phases entered
inside it excluded) to its totals.

``c128a fuzz`` runs one in every worker, always, through an
:class:`ExampleTimer`, and reports the phases folded into :data:`BUCKETS`
(:func:`split`). It adds no device synchronisation (one per phase would cost
the very rate it explains), so a phase is host wall time, and on CUDA a
kernel's device time lands in the first later phase that waits for it. The
synchronisations the harness has anyway decide where:

- ``tensors``: the step's tensors go to the device in one copy through
  pinned memory, not waited for;
- ``validation`` (in the target's build, for the project's builders and the
  reference): one read-back of the argument checks before the launch, which
  waits for the step's tensors and buffers; the launch itself returns
  before the kernel runs (a first call's compile is host time, in ``target``);
- ``readback``: the build's buffers and views copied to the host, once a
  build (:meth:`c128a.step.BuildResult.on_host`), which waits for the
  target's kernel;
- ``oracle`` and ``comparison``: on the host, after the read-back.

So on CUDA the target bucket is host time (argument checks, launches,
compiles) with the wait of the project's argument checks, and the checks
bucket carries the kernels' device time, in ``readback``;
on the CPU (and under Triton's interpreter) everything is synchronous and
each bucket is exact. ``c128a bench --throughput`` synchronises at the end of
every phase, for device-exact phase times of one property.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import Counter
from typing import Callable, Iterator, Mapping

PHASES = (
    "draw", "tensors", "buffers", "validation", "target", "readback", "oracle", "comparison",
    "other",
)
"""The phases, in the order reports list them: Hypothesis drawing the step
(everything outside the check), the step's tensors, poisoned buffers, the
contract's argument checks, the target's build (its checks excluded), the
the result read back to the host (the wait for the device), the oracle's
expected values, comparing with them, and the rest of the check."""

_running: "PhaseClock | None" = None
_now = time.perf_counter  # the phases' clock (a test may replace it)


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
        self._stack.append([name, _now(), 0.0])

    def stop(self) -> float:
        """End the innermost phase; its own time (nested phases excluded)."""
        if self.sync is not None:
            self.sync()
        name, start, nested = self._stack.pop()
        elapsed = _now() - start
        own = elapsed - nested
        self.totals[name] += own
        if self._stack:
            self._stack[-1][2] += elapsed
        return own


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


# ---------------------------------------------------------------- a fuzz run's time split

BUCKETS = ("drawing", "target", "oracle", "checks", "supervision")
"""Where a fuzz worker's wall time goes, in the order reports list them:
Hypothesis drawing the examples; the target's calls (its build, its argument
checks, its width policy); the oracle's expected values; the checks (the
comparisons, diffs and the rest of each check, the step's tensors and
poisoned buffers included); supervision: everything else (process start,
Hypothesis's engine, shrinking, the database, in-flight files, messages)."""

BUCKET_OF = {
    "draw": "drawing",
    "validation": "target",  # the target's own argument checks, inside its build
    "target": "target",
    "readback": "checks",
    "oracle": "oracle",
    "tensors": "checks",
    "buffers": "checks",
    "comparison": "checks",
    "other": "checks",
}
"""The bucket each measured phase counts in; any other name (``inflight``,
``startup``: parts of supervision a runner times) counts in supervision."""


def split(seconds: Mapping[str, float], wall: float) -> dict[str, float]:
    """``seconds`` (phase or detail name -> seconds) folded into
    :data:`BUCKETS`; supervision is what ``wall`` leaves (never negative),
    so the buckets add up to ``wall`` unless the phases exceed it."""
    buckets = dict.fromkeys(BUCKETS, 0.0)
    for name, spent in seconds.items():
        bucket = BUCKET_OF.get(name)
        if bucket is not None:
            buckets[bucket] += max(spent, 0.0)
    measured = sum(buckets.values())
    buckets["supervision"] = max(wall - measured, 0.0)
    return buckets


def shares(buckets: Mapping[str, float]) -> dict[str, float]:
    """Each bucket's fraction of their sum (all 0.0 for an empty split)."""
    total = sum(buckets.values())
    return {name: (spent / total if total > 0 else 0.0) for name, spent in buckets.items()}


class ExampleTimer:
    """Always-on accounting of a runner's examples (``c128a fuzz``'s workers).

    Around each example's check, ``begin(drawn)`` and ``end(drawn)``, with
    ``drawn`` the seconds Hypothesis says it spent drawing the example so far
    (its own timing, :func:`c128a.hypothesis_private.drawn_seconds`, what its
    observations report as ``timing["generate:..."]``). Between them a
    :class:`PhaseClock` without synchronisation charges the harness's phases;
    the rest of the window is the check's ``other``, less the draws made
    inside it (a state machine draws its rules while it runs), which count as
    ``draw``.
    ``charge`` adds time a runner measured itself; ``take`` returns the
    seconds per name since the last ``take``. Costs two clock reads and a
    few dictionary updates per example.
    """

    def __init__(self):
        self.clock = PhaseClock()  # no sync: see the module's docstring
        self._drawn_before: float | None = None

    @property
    def open(self) -> bool:
        return self._drawn_before is not None

    def begin(self, drawn: float = 0.0) -> None:
        if self.open:
            self.cancel()
        self.clock.__enter__()
        self.clock.start("other")
        self._drawn_before = drawn

    def end(self, drawn: float = 0.0) -> None:
        """Close the window: ``drawn`` is Hypothesis's draw time of the
        example now. Does nothing when no window is open."""
        if not self.open:
            return
        while len(self.clock._stack) > 1:  # a phase left open (cannot happen through phase())
            self.clock.stop()
        own = self.clock.stop()
        self.clock.__exit__(None, None, None)
        inside = max(drawn - self._drawn_before, 0.0)
        self.clock.totals["other"] -= min(inside, own)
        self.clock.totals["draw"] += drawn
        self._drawn_before = None

    def cancel(self) -> None:
        """Close the window charging nothing for its own time (the phases
        already ended in it stay charged): its time counts as supervision."""
        if not self.open:
            return
        self.clock._stack.clear()
        self.clock.__exit__(None, None, None)
        self._drawn_before = None

    def charge(self, name: str, seconds: float) -> None:
        self.clock.totals[name] += seconds

    def take(self) -> dict[str, float]:
        """Seconds per name since the last call (names with time only)."""
        taken = {name: spent for name, spent in self.clock.totals.items() if spent}
        self.clock.totals.clear()
        return taken
