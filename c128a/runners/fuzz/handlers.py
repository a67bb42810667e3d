"""What the supervisor does with each message a worker sends: one handler a
kind of :mod:`.protocol` message, found by the message's type (as
pytest-xdist's controller has a ``worker_<event>`` method an event).
Anything else on a worker's channel is an error of the suite."""

from __future__ import annotations

import time
from typing import ClassVar

from ...cases import Case
from ...failures import CaseError
from . import protocol


class MessageHandlers:
    """The handlers of a run's :class:`~.supervisor.Supervisor` (``run``),
    each called with the sending worker's index and its message. They
    update the run's worker slots and stats, its tallies (labels, reach,
    per_property), its errors and its case book (``book``); what a worker
    that is shrinking has sent is held by the run's
    :class:`~.losses.LostWorkers`."""

    handlers: ClassVar[dict[type[protocol.Message], str]] = {
        protocol.Ready: "on_ready",
        protocol.Progress: "on_progress",
        protocol.Found: "on_found",
        protocol.Shrinking: "on_shrinking",
        protocol.Failure: "on_failure",
        protocol.SuiteError: "on_error",
        protocol.Fatal: "on_fatal",
        protocol.Done: "on_done",
    }
    """Each message type's handler, by name."""

    def __init__(self, run):
        self.run = run

    def handle(self, index: int, message) -> None:
        name = self.handlers.get(type(message))
        if name is None:
            self.run.errors.append(f"worker {index} sent a message the suite does not know: "
                               f"{message!r:.300}")
            return
        getattr(self, name)(index, message)

    def on_ready(self, index: int, message: protocol.Ready) -> None:
        slot, stats = self.run.slots[index], self.run.stats[index]
        slot.ready, stats.state = True, "running"
        stats.seconds["startup"] += slot.activity - slot.spawned

    def on_progress(self, index: int, message: protocol.Progress) -> None:
        stats = self.run.stats[index]
        stats.examples += message.examples
        stats.seconds.update(message.time)
        stats.running = message.running
        self.run.slots[index].round = message.round
        self.run.labels.update(message.labels)
        self.run.reach.update(message.reach)
        self.run.per_property.update(message.per_property)

    def readable_case(self, index: int, case: Case) -> Case | None:
        """``case`` as it will load from its file; one that would not load
        back is an error of the suite, not saved."""
        try:
            return Case.from_json(case.to_json())
        except CaseError as exc:
            self.run.errors.append(f"worker {index} sent a case the suite cannot read: {exc}")
            return None

    def on_found(self, index: int, message: protocol.Found) -> None:
        self.run.losses.drop_held(index)
        case = self.readable_case(index, message.case)
        if case is not None:
            self.found(index, case)

    def on_shrinking(self, index: int, message: protocol.Shrinking) -> None:
        """Held, not saved: the round's first failing example is on disk
        already; this one replaces it if the shrinking is cut short."""
        case = self.readable_case(index, message.case)
        if case is not None:
            self.run.losses.hold(index, case)

    def on_failure(self, index: int, message: protocol.Failure) -> None:
        self.run.losses.drop_held(index)
        case = self.readable_case(index, message.case)
        if case is not None:
            self.shrunk(index, case)

    def on_error(self, index: int, message: protocol.SuiteError) -> None:
        self.run.errors.append(f"worker {index}: {message.text}")

    def on_fatal(self, index: int, message: protocol.Fatal) -> None:
        self.run.fatal = f"worker {index}: {message.text}"
        self.run.request_halt("a worker's fatal error")

    def on_done(self, index: int, message: protocol.Done) -> None:
        slot, stats = self.run.slots[index], self.run.stats[index]
        slot.finished, stats.state, stats.finished = True, "done", time.monotonic()
        # The run's stop ended its shrinking: the smallest example found stays.
        self.run.losses.cut_short(index, f"{self.run.stopped_by or 'the stop'} ended it")

    def found(self, index: int, case: Case) -> None:
        """A worker's first failing example, before it shrinks."""
        if self.run.book.found(index, case):
            self.run.stats[index].failures += 1

    def shrunk(self, index: int, case: Case) -> None:
        """A worker's shrunk failure."""
        self.run.stats[index].failures += self.run.book.shrunk(index, case)
