"""A serving-loop example as the engine steps it built, replayable without Hypothesis.

A reproduce blob holds the choices one Hypothesis release made; another
release may read them differently, or refuse them. The serving-loop
machine (:mod:`c128a.replay.serving`) therefore records each step it
builds, the padded :class:`~c128a.step.Batch` with the rule that caused
it (none when the example failed as its engine captured), and attaches the
record to whatever the example raised
(:func:`attach_steps`, :func:`machine_steps_of`). A case keeps it
(``machine_steps``), and the machine's ``replay_recorded`` runs the same
batches through the same kind of engine (captured at the replay target's
width, every check the machine makes), with no Hypothesis involved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ..contract import MAX_CAPACITY, MAX_MODEL_LEN
from ..step import Batch
from ..step.schema import Range

MAX_CAPTURE_LIMIT = 4096
"""The largest capture limit a recorded engine may name (its buffers hold
that many rows: 4,096 x 8,192 int32, inside the suite's buffer bound)."""
MAX_KV_SLOTS = 1 << 26
"""The largest KV table a recorded engine may name (a 1M-context engine's
machine uses about 41,000 slots)."""

STEPS_ATTRIBUTE = "c128a_machine_steps"
"""The attribute of a serving-loop example's exception that holds its
:class:`MachineSteps`."""


@dataclass(frozen=True)
class MachineStep:
    """One engine step of a serving-loop example: the rule that caused it and
    what the step was (the machine's note), and the padded batch it built."""

    description: str
    batch: Batch


@dataclass(frozen=True)
class MachineSteps:
    """The engine a serving-loop example ran on and the steps it built, in
    order, up to and including the one that failed. Each field's annotation
    is its JSON schema (:mod:`c128a.step.schema`).

    ``capture_width`` is the width the recording target captured its
    consumers at (None: its policy gave no valid one, and the failure came
    at capture); a replay captures at its own target's width, and builds
    each step at the width its own policy chooses for the step. No step: the
    example failed at capture, which a replay does again."""

    max_model_len: Annotated[int, Range(1, MAX_MODEL_LEN)]
    capture_width: Annotated[int, Range(1, MAX_CAPACITY)] | None
    capture_limit: Annotated[int, Range(1, MAX_CAPTURE_LIMIT)]
    kv_slots: Annotated[int, Range(1, MAX_KV_SLOTS)]
    block_size: Annotated[int, Range(1, 1 << 16)]
    steps: tuple[MachineStep, ...] = ()

    def listing(self) -> str:
        """The steps as the machine noted them, one a line."""
        return "\n".join(step.description for step in self.steps) or "(no step: it failed at capture)"


def recorded_width(width) -> int | None:
    """A capture width as a record holds it: None where the target's policy
    gave no width a case may hold (the record must stay readable)."""
    valid = isinstance(width, int) and not isinstance(width, bool) and 1 <= width <= MAX_CAPACITY
    return width if valid else None


def attach_steps(exc: BaseException, steps: MachineSteps) -> None:
    """Record ``steps`` on ``exc``, the failure of the example that built
    them (the first record wins: an exception re-raised through an outer
    step keeps the steps of its own example)."""
    if getattr(exc, STEPS_ATTRIBUTE, None) is None:
        try:
            setattr(exc, STEPS_ATTRIBUTE, steps)
        except AttributeError:  # an exception type without a __dict__
            pass


def machine_steps_of(exc: BaseException | None) -> MachineSteps | None:
    """The steps recorded on ``exc``, or on the first exception of a group
    (Hypothesis reports several distinct failures as one) that has them."""
    if exc is None:
        return None
    found = getattr(exc, STEPS_ATTRIBUTE, None)
    if found is not None:
        return found
    for inner in getattr(exc, "exceptions", ()):
        if (found := machine_steps_of(inner)) is not None:
            return found
    return None
