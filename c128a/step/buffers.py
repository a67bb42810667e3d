"""The persistent buffers, and one build of a step into them.

:func:`build` runs a target on a step and wraps whatever the target's code
raises as :class:`~c128a.failures.TargetRaised`; :func:`oracle_build` runs
the oracle, whose refusal means the suite drew a step outside the contract
(:class:`~c128a.failures.HarnessError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .. import phases
from ..contract import SLOTS, Views, write_metadata
from ..failures import HarnessError, InvariantViolation, call_target

if TYPE_CHECKING:
    from .batch import Batch

POISON = -99
"""Fill value of every buffer before a build: anything still -99 was not written."""


@dataclass
class Buffers:
    """The persistent buffers: [rows, capacity] decode and prefill, [rows] lens."""

    global_decode: torch.Tensor
    decode_lens: torch.Tensor
    prefill: torch.Tensor

    @classmethod
    @phases.measured("buffers")
    def allocate(
        cls,
        rows: int,
        capacity: int,
        device: torch.device | str,
        fill: int = POISON,
        *,
        prefill_capacity: int | None = None,
    ) -> "Buffers":
        prefill_capacity = capacity if prefill_capacity is None else prefill_capacity
        return cls(
            global_decode=torch.full((rows, capacity), fill, dtype=torch.int32, device=device),
            decode_lens=torch.full((rows,), fill, dtype=torch.int32, device=device),
            prefill=torch.full((rows, prefill_capacity), fill, dtype=torch.int32, device=device),
        )

    @classmethod
    def for_batch(cls, batch: "Batch", device: torch.device | str, fill: int = POISON) -> "Buffers":
        """The persistent buffers ``batch`` describes, filled with ``fill``."""
        return cls.allocate(
            batch.buffer_rows,
            batch.capacity,
            device,
            fill,
            prefill_capacity=batch.capacity + batch.prefill_extra_columns,
        )

    def clone(self) -> "Buffers":
        return Buffers(self.global_decode.clone(), self.decode_lens.clone(), self.prefill.clone())

    def fill_(self, value: int) -> "Buffers":
        """Every element of every buffer set to ``value``, in place (same memory)."""
        for buffer in self.as_tuple():
            buffer.fill_(value)
        return self

    def copy_(self, other: "Buffers") -> "Buffers":
        """``other``'s contents copied in, in place (same memory, any device)."""
        for buffer, source in zip(self.as_tuple(), other.as_tuple()):
            buffer.copy_(source)
        return self

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.global_decode, self.decode_lens, self.prefill


@dataclass
class BuildResult:
    """What a build returned and the buffers it wrote into."""

    batch: "Batch"
    width: int
    views: Views
    buffers: Buffers


def build(
    target,
    batch: "Batch",
    device: torch.device | str,
    *,
    width: int | None = None,
    buffers: Buffers | None = None,
) -> BuildResult:
    """Run ``target``'s builder on ``batch`` at ``width`` (the batch's own by
    default) into ``buffers`` (fresh, poisoned with :data:`POISON`, by
    default). What the target raises is a :class:`~c128a.failures.TargetRaised`."""
    width = batch.width if width is None else width
    if buffers is None:
        buffers = Buffers.for_batch(batch, device)
    args = batch.build_args(batch.tensors(device), buffers, width)
    with phases.phase("target"):
        views = call_target(
            "target_raised", "build_c128a_topk_metadata", target.build_c128a_topk_metadata, *args
        )
    return BuildResult(batch=batch, width=width, views=tuple_of_views(views), buffers=buffers)


def oracle_build(
    batch: "Batch", device: torch.device | str, *, width: int | None = None,
    buffers: Buffers | None = None, padding_rows: str = SLOTS,
) -> BuildResult:
    """The oracle's build of ``batch`` (unchecked: steps come from the
    strategies or from a validated case) under the ``padding_rows`` variant.
    A refusal means the suite itself drew a step outside the contract."""
    width = batch.width if width is None else width
    if buffers is None:
        buffers = Buffers.for_batch(batch, device)
    args = batch.build_args(batch.tensors(device), buffers, width)
    with phases.phase("oracle"):
        try:
            views = write_metadata(args, padding_rows)
        except Exception as exc:
            raise HarnessError(
                f"the oracle could not build a step the suite drew ({type(exc).__name__}: {exc}); "
                f"the strategies must draw steps inside the contract"
            ) from exc
    return BuildResult(batch=batch, width=width, views=views, buffers=buffers)


def tuple_of_views(views) -> Views:
    """A target's returned triple as :class:`~c128a.contract.Views`."""
    try:
        return Views(*views)
    except TypeError:
        raise InvariantViolation(
            "views",
            f"build_c128a_topk_metadata returned {type(views).__name__} {views!r:.100}, not "
            "the three views (global_decode, decode_lens, prefill_local)",
        ) from None
