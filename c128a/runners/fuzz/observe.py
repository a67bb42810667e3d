"""What a worker observes of its rounds: the examples it counts and sends
(:class:`ProgressCounter`) and the Hypothesis blob of a round's failure
(:class:`FailureBlob`)."""

from __future__ import annotations

import time
from collections import Counter

from ... import phases
from ...hypothesis_private import FailureObserver
from . import protocol

PROGRESS_INTERVAL_S = 0.5


class FailureBlob:
    """Hypothesis's reproduce blob for the failure a round ends with: that of
    the last failing test case observed, the minimal one once shrinking is
    over. Observing costs a little per example, so a property round starts it
    at the first failure, when shrinking starts."""

    def __init__(self, on_first_failure=None):
        self.blob: str | None = None
        self.failed = False  # an example of the round failed (shrinking runs)
        # Called with the first failing example's blob and representation
        # (a state machine's steps), before shrinking starts.
        self.on_first_failure = on_first_failure
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
            per_property=dict(self.per_property), running=self.running, time=self.timer.take(),
        ))
        self.examples = 0
        self.labels.clear()
        self.reach.clear()
        self.per_property.clear()
        self.sent_at = time.monotonic()
