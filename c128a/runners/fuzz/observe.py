"""What a worker observes of its rounds: the examples it counts and sends
(:class:`ProgressCounter`), the Hypothesis blob of a round's failure
(:class:`FailureBlob`) and the smaller failing examples its shrinking finds
(:class:`ShrinkReports`)."""

from __future__ import annotations

import time
from collections import Counter

from ... import phases
from ...hypothesis_private import FailureObserver
from . import protocol

PROGRESS_INTERVAL_S = 0.5
SHRINKING_INTERVAL_S = 0.5
"""The most often a worker sends a smaller failing example while it shrinks."""


class FailureBlob:
    """Hypothesis's reproduce blob for the failure a round ends with: that of
    the last failing test case observed, the minimal one once shrinking is
    over. Observing costs a little per example, so a property round starts it
    at the first failure, when shrinking starts."""

    def __init__(self, on_first_failure=None, on_later_failure=None):
        self.blob: str | None = None
        self.failed = False  # an example of the round failed (shrinking runs)
        # Called with the first failing example's blob and representation
        # (a state machine's steps), before shrinking starts; then with each
        # later one's, as shrinking finds them.
        self.on_first_failure = on_first_failure
        self.on_later_failure = on_later_failure
        self._observer = FailureObserver(self._failed)

    def start(self) -> None:
        self._observer.start()

    def stop(self) -> None:
        self._observer.stop()

    def _failed(self, blob: str | None, representation: str) -> None:
        first = not self.failed
        self.failed = True
        if blob is not None:
            self.blob = blob
        if first and self.on_first_failure is not None:
            self.on_first_failure(self.blob, representation)
        elif not first and self.on_later_failure is not None:
            self.on_later_failure(self.blob, representation)


class ShrinkReports:
    """The smaller failing examples a round's shrinking finds, sent as
    :class:`~.protocol.Shrinking` messages: the latest one at most every
    :data:`SHRINKING_INTERVAL_S`, and whatever is unsent when the round is
    cut short (:meth:`flush`). ``send(case)`` sends one; a case is made only
    when it is sent (``make()``), from what the round knows by then: the
    blob of the failing example, which Hypothesis gives once it has ended."""

    def __init__(self, send):
        self.send = send
        self.latest = None  # make() of the latest failing example not yet sent
        self.sent_at = time.monotonic()

    def found(self, make) -> None:
        """A smaller failing example: ``make()`` gives its case."""
        self.latest = make

    def due(self) -> None:
        """Send the latest if the interval has passed since the last send."""
        if self.latest is not None and time.monotonic() - self.sent_at >= SHRINKING_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        if self.latest is not None:
            make, self.latest = self.latest, None
            self.send(make())
            self.sent_at = time.monotonic()


class ProgressCounter:
    """Counts examples and labels; sends them, and the seconds ``timer``
    charged since the last message, to the parent every so often."""

    def __init__(self, channel, index: int, timer: phases.ExampleTimer | None = None):
        self.channel, self.index = channel, index
        self.timer = timer or phases.ExampleTimer()
        self.examples = 0  # since the last flush
        self.total = 0
        self.labels: Counter[str] = Counter()
        self.reach: Counter[str] = Counter()
        self.per_property: Counter[str] = Counter()
        self.sent_at = time.monotonic()
        self.running = ""
        self.round = 0  # the number of the round now running

    def count(self, name: str, labels=(), reach=()) -> None:
        """One example of property ``name``: the step's own ``labels`` and
        its ``reach`` labels (:func:`~c128a.strategies.reach.labels_of`)."""
        self.examples += 1
        self.total += 1
        self.per_property[name] += 1
        self.labels.update(labels)
        self.reach.update(reach)
        if time.monotonic() - self.sent_at >= PROGRESS_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        self.channel.put(protocol.Progress(
            self.index, examples=self.examples, labels=dict(self.labels), reach=dict(self.reach),
            per_property=dict(self.per_property), running=self.running, round=self.round,
            time=self.timer.take(),
        ))
        self.examples = 0
        self.labels.clear()
        self.reach.clear()
        self.per_property.clear()
        self.sent_at = time.monotonic()
