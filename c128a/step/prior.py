"""The shape of the step built into a step's buffers before it.

An engine builds every step, and every C128A-like layer of another
geometry, into the same persistent buffers, so what a build finds there was
left by a step of any shape (CONTRACT.md, "The whole input space"). A
:class:`PriorStep` records that earlier step's shape as a few ints, so a
saved case (:class:`~c128a.step.Batch` ``prior``) rebuilds the same history;
its rows are derived from it and the step alone
(:func:`c128a.checks.prior_shape.shaped_earlier_step`).

The buffers are allocated once per engine, so the earlier step cannot have
had another :class:`~c128a.step.BufferLayout` of the same memory; what it
can have had is another placement of its two 2-D buffers in it: the decode
and prefill buffers used the other way round (a workspace that hands two
equal scratch buffers out in either order), views starting
``row_offset`` rows into them (a workspace slice handed out further on), or
views at the same addresses with another geometry (``columns``: a freed
workspace handed to a step of another capacity, its rows another row stride
apart; a builder that keeps anything per buffer address must notice).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any

from .schema import Range

MAX_PRIOR_ROWS = 1 << 16
"""The most rows of either buffer an earlier step may fill or skip (a
saved case's bound; the buffers' own row count bounds it further)."""

Rows = Annotated[int, Range(0, MAX_PRIOR_ROWS)]


@dataclass(frozen=True)
class PriorStep:
    """The step built into the same buffers before this one: its decode
    rows, prefill rows, compress ratio R and block size B (a layer of
    another geometry), and where its buffers sat in this step's memory:
    ``swapped`` (its decode buffer was this step's prefill buffer and the
    other way round), ``row_offset`` (its row 0 was this step's row
    ``row_offset``) and ``columns`` (its 2-D buffers had this many columns,
    dense rows that far apart, from the same first address as this step's:
    another capacity and row stride at a reused address; 0: this step's
    geometry). Its width is the step's ``prior_width``.

    Each field's annotation is its JSON schema (:mod:`c128a.step.schema`).
    """

    num_decode_tokens: Rows
    num_prefill_tokens: Rows
    compress_ratio: Annotated[int, Range(1, 1 << 16)]
    block_size: Annotated[int, Range(1, 1 << 16)]
    swapped: bool = False
    row_offset: Rows = 0
    columns: Annotated[int, Range(0, 1 << 17)] = 0

    def to_json(self) -> dict[str, Any]:
        """Every field; ``columns`` left out where 0, so a history recorded
        before it existed writes what it wrote then (case names, seeds)."""
        data = dataclasses.asdict(self)
        if not self.columns:
            del data["columns"]
        return data

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens

    @property
    def rows_needed(self) -> int:
        """Rows each of this step's buffers needs to hold the earlier step."""
        return self.row_offset + max(self.num_decode_tokens, self.num_prefill_tokens)
