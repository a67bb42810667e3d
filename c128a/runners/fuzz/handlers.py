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
    """The :class:`~.supervisor.Supervisor`'s handlers, each called with the
    sending worker's index and its message. They update the supervisor's
    worker slots and stats, its tallies (labels, reach, per_property), its
    errors and its case book (``book``)."""

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

    def handle(self, index: int, message) -> None:
        name = self.handlers.get(type(message))
        if name is None:
            self.errors.append(f"worker {index} sent a message the suite does not know: "
                               f"{message!r:.300}")
            return
        getattr(self, name)(index, message)

    def on_ready(self, index: int, message: protocol.Ready) -> None:
        slot, stats = self.slots[index], self.stats[index]
        slot.ready, stats.state = True, "running"
        stats.seconds["startup"] += slot.activity - slot.spawned

    def on_progress(self, index: int, message: protocol.Progress) -> None:
        stats = self.stats[index]
        stats.examples += message.examples
        stats.seconds.update(message.time)
        stats.running = message.running
        self.slots[index].round = message.round
        self.labels.update(message.labels)
        self.reach.update(message.reach)
        self.per_property.update(message.per_property)

    def readable_case(self, index: int, case: Case) -> Case | None:
        """``case`` as it will load from its file; one that would not load
        back is an error of the suite, not saved."""
        try:
            return Case.from_json(case.to_json())
        except CaseError as exc:
            self.errors.append(f"worker {index} sent a case the suite cannot read: {exc}")
            return None

    def on_found(self, index: int, message: protocol.Found) -> None:
        self.best.pop(index, None)
        case = self.readable_case(index, message.case)
        if case is not None:
            self.found(index, case)

    def on_shrinking(self, index: int, message: protocol.Shrinking) -> None:
        """Held, not saved: the round's first failing example is on disk
        already; this one replaces it if the shrinking is cut short."""
        case = self.readable_case(index, message.case)
        if case is not None:
            self.best[index] = case

    def on_failure(self, index: int, message: protocol.Failure) -> None:
        self.best.pop(index, None)
        case = self.readable_case(index, message.case)
        if case is not None:
            self.shrunk(index, case)

    def on_error(self, index: int, message: protocol.SuiteError) -> None:
        self.errors.append(f"worker {index}: {message.text}")

    def on_fatal(self, index: int, message: protocol.Fatal) -> None:
        self.fatal = f"worker {index}: {message.text}"
        self.request_halt("a worker's fatal error")

    def on_done(self, index: int, message: protocol.Done) -> None:
        slot, stats = self.slots[index], self.stats[index]
        slot.finished, stats.state, stats.finished = True, "done", time.monotonic()
        # The run's stop ended its shrinking: the smallest example found stays.
        self.cut_short(index, f"{self.stopped_by or 'the stop'} ended it")

    def case_recorded(self) -> None:
        if self.config.exitfirst:
            self.request_stop("--exitfirst")

    def found(self, index: int, case: Case) -> None:
        """A worker's first failing example, before it shrinks."""
        if self.book.found(index, case):
            self.stats[index].failures += 1

    def shrunk(self, index: int, case: Case) -> None:
        """A worker's shrunk failure."""
        self.stats[index].failures += self.book.shrunk(index, case)
