"""What a fuzz worker tells the supervisor: one small frozen type a message.

A worker puts these on its channel (a multiprocessing queue, so each is
pickled); the supervisor dispatches each by its type to one handler
(:class:`~.handlers.MessageHandlers`). Anything else arriving on a
channel is an error of the suite, reported, never ignored. Every message
names the worker that sent it; ``kind`` is its name in tests and messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...cases import Case


@dataclass(frozen=True)
class Message:
    worker: int
    kind: ClassVar[str] = "message"


@dataclass(frozen=True)
class Ready(Message):
    """The worker loaded the target and everything else: its examples start."""

    kind: ClassVar[str] = "ready"


@dataclass(frozen=True)
class Progress(Message):
    """What the worker ran since its last progress message."""

    examples: int = 0
    labels: dict[str, int] = field(default_factory=dict)  # a step's labels -> examples
    reach: dict[str, int] = field(default_factory=dict)  # "dimension: bucket" -> examples
    per_property: dict[str, int] = field(default_factory=dict)
    running: str = ""  # the property or machine of the round now running
    round: int = 0  # that round's number in the worker's rotation (a restart goes on after it)
    time: dict[str, float] = field(default_factory=dict)  # phase -> seconds (phases.ExampleTimer)
    kind: ClassVar[str] = "progress"


@dataclass(frozen=True)
class Found(Message):
    """A round's first failing example, sent before the round shrinks it."""

    case: Case
    kind: ClassVar[str] = "found"


@dataclass(frozen=True)
class Shrinking(Message):
    """A smaller failing example of the round the worker is shrinking: the
    supervisor holds the latest, and keeps it in place of the round's
    :class:`Found` case when the shrinking is cut short (the run's stop, a
    kill, a crash)."""

    case: Case
    kind: ClassVar[str] = "shrinking"


@dataclass(frozen=True)
class Failure(Message):
    """The failure a round ended with, shrunk: it replaces the round's
    :class:`Found` case."""

    case: Case
    kind: ClassVar[str] = "failure"


@dataclass(frozen=True)
class SuiteError(Message):
    """A round failed by a fault of the suite itself, not of the target; the
    worker goes on with its next round."""

    text: str
    kind: ClassVar[str] = "error"


@dataclass(frozen=True)
class Fatal(Message):
    """The worker cannot run at all (its setup failed): the run stops."""

    text: str
    kind: ClassVar[str] = "fatal"


@dataclass(frozen=True)
class Done(Message):
    """The worker ended normally: its budget spent, or the run's stop."""

    kind: ClassVar[str] = "done"


MESSAGES = (Ready, Progress, Found, Shrinking, Failure, SuiteError, Fatal, Done)
