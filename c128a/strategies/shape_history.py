"""The shape of the step built into a step's buffers before it: drawn.

:func:`with_shape_history` gives each drawn step a
:class:`~c128a.step.PriorStep`: an earlier step with more or fewer decode
rows and prefill rows than the step (within its 64-row block or across
one), so more or fewer tokens, a compress ratio and block size of another
layer, and its buffers placed otherwise in the same memory (swapped, from a
row offset), and now and then at the step's own addresses with another
row stride and width (a freed workspace reused by a step of another
capacity, :data:`REUSE_ONE_IN`). Each part is the same as the step's for
one draw in :data:`KINDS` or so; the buffers grow by the rows the earlier
step needs, within what a case may hold. Shrinks towards the step's own
shape (every kind 0) and no row offset.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from ..contract import WIDTH_ALIGNMENT
from ..step import MAX_BUFFER_ELEMENTS, MAX_BUFFER_ROWS, Batch, PriorStep
from . import steering
from .engine import steer_of
from .history import engine_batch
from .layout import Fields
from .reach import ROW_BLOCK, blocks

ROW_KINDS = ("same", "fewer, same block", "fewer, across a block", "more, same block",
             "more, across a block")
"""How an earlier step's row count relates to the step's, in 64-row blocks."""

OTHER_RATIOS = (4, 1, 2, 64, 256, 3, 1000)
"""Compress ratios of another layer (DeepSeek-V4's C4A layers compress 4:1),
powers of two and not."""

OTHER_BLOCK_SIZES = (64, 1, 4, 3, 128, 300)
"""Block sizes of another layer's pages, powers of two and not."""

PRIOR_BYTES = 5 + 4 * 2
"""Bytes a shape history is drawn from: five kinds of one byte, four values of two."""

SAME_T_ONE_IN = 2
"""One earlier step in this many keeps the step's token count T with its
own decode rows (another split of the same T, where the decode rows differ)."""

ACROSS_BY = 8
"""An earlier step with more rows across a block has up to this many rows
in the block past the step's last one: the crossing is what matters, and
each row costs a build under Triton's interpreter."""

MAX_ROW_OFFSET = 80
"""The furthest an earlier step's buffers start into the step's (rows):
past one 64-row block."""

REUSE_ONE_IN = 3
"""One earlier step in this many had its buffers at the step's addresses
with another row stride and width (:attr:`~c128a.step.PriorStep.columns`)."""


def _rows(kind: int, value: int, rows: int) -> int:
    """An earlier row count of ``kind`` (:data:`ROW_KINDS`) against the step's
    ``rows``; the step's own where the kind is impossible (no fewer than 0)."""
    kind %= len(ROW_KINDS)
    first = ROW_BLOCK * (blocks(rows) - 1) + 1 if rows else 0  # first row of the last block
    if kind == 1 and first < rows:
        return first + value % (rows - first)
    if kind == 2 and rows:
        return value % first if first else 0
    last = ROW_BLOCK * blocks(rows)
    if kind == 3 and rows < last:
        return rows + 1 + value % (last - rows)
    if kind == 4:
        return last + 1 + value % ACROSS_BY
    return rows


def _other(options: tuple[int, ...], value: int, own: int) -> int:
    choices = [v for v in options if v != own]
    return choices[value % len(choices)]


@st.composite
def with_shape_history(draw, steps: st.SearchStrategy[Batch]) -> Batch:
    """A step of ``steps`` recording the shape of the step built into its
    buffers before it (:class:`~c128a.step.PriorStep`): decode and prefill
    rows of each :data:`ROW_KINDS` kind (for one in :data:`SAME_T_ONE_IN`
    the prefill rows that keep the step's T), R and B of another layer (the
    same, another R, another B, both), its buffers the same, swapped or
    starting up to :data:`MAX_ROW_OFFSET` rows in. The step's buffers grow
    to the earlier step's rows where the case's size bound allows, else the
    earlier step keeps the step's own rows."""
    batch = draw(steps)
    # Bytes, as every step's draw: Hypothesis weights drawn integers towards
    # constants of the modules loaded, so integer draws would differ between
    # a pytest run and the c128a command.
    fields = Fields(draw(st.binary(min_size=PRIOR_BYTES, max_size=PRIOR_BYTES)))
    kinds = [fields.uint(1) for _ in range(5)]
    values = [fields.uint(2) for _ in range(4)]
    decode_kind, prefill_kind, geometry_kind, placement_kind, split_kind = kinds
    steer = steer_of(batch)
    if steer:
        # The row the step was steered by steers its history too.
        decode_kind = steering.history_kind(decode_kind, "decode rows history",
                                            steering.ROW_KINDS, steer)
        prefill_kind = steering.history_kind(prefill_kind, "prefill rows history",
                                             steering.ROW_KINDS, steer)
        geometry_kind = steering.history_kind(geometry_kind, "geometry history",
                                              steering.GEOMETRY_KINDS, steer)
        placement_kind = steering.history_kind(placement_kind, "layout history",
                                               steering.PLACEMENT_KINDS, steer)
        split_kind = steering.same_tokens(split_kind, steer)
        split_kind = steering.address_reuse(split_kind, REUSE_ONE_IN, steer)
    decode = _rows(decode_kind, values[0], batch.num_decode_tokens)
    prefill = _rows(prefill_kind, values[1], batch.num_prefill_tokens)
    if split_kind % SAME_T_ONE_IN == SAME_T_ONE_IN - 1 and decode <= batch.num_tokens:
        # The same T split otherwise: what a split kept per token count misses.
        prefill = batch.num_tokens - decode
    geometry = geometry_kind % 4
    ratio = batch.compress_ratio
    block = batch.block_size
    if geometry in (1, 3):
        ratio = _other(OTHER_RATIOS, values[2], ratio)
    if geometry in (2, 3):
        block = _other(OTHER_BLOCK_SIZES, values[2] >> 4, block)
    placement = placement_kind % 3
    offset = 1 + values[3] % MAX_ROW_OFFSET if placement == 2 else 0
    prior = PriorStep(decode, prefill, ratio, block, swapped=placement == 1, row_offset=offset)
    row = batch.capacity + max(batch.prefill_extra_columns, 0) + batch.buffer_row_padding
    most_rows = min(MAX_BUFFER_ROWS, MAX_BUFFER_ELEMENTS // row)
    if prior.rows_needed > most_rows:
        prior = dataclasses.replace(
            prior, num_decode_tokens=batch.num_decode_tokens,
            num_prefill_tokens=batch.num_prefill_tokens, row_offset=0,
        )
    rows = max(batch.buffer_rows, prior.rows_needed)
    batch = dataclasses.replace(batch, buffer_rows=rows, prior=prior)
    # The split's byte reads its lowest bit only: the reuse is read from the
    # others, so no byte is drawn for it and earlier draws keep their history.
    reuse = split_kind >> 1
    if reuse % REUSE_ONE_IN == REUSE_ONE_IN - 1:
        batch = at_the_same_addresses(batch, reuse // REUSE_ONE_IN)
    return batch


def at_the_same_addresses(batch: Batch, value: int) -> Batch:
    """``batch`` whose earlier step had its buffers at the step's addresses
    as dense rows of another column count (another capacity: another row
    stride and width; ``value``'s low bit picks narrower or wider, its next
    bit by how many 128-column tiles), at a width those columns hold, the
    buffers grown to hold its rows; ``batch`` itself where they cannot."""
    prior = batch.prior
    pad = batch.buffer_row_padding
    widths = (batch.capacity, batch.capacity + batch.prefill_extra_columns)
    strides = [w + pad for w in widths]
    tiles = 1 + (value >> 1) % 2
    columns = (min(strides) // WIDTH_ALIGNMENT - tiles) * WIDTH_ALIGNMENT
    if value % 2 or columns < WIDTH_ALIGNMENT:
        columns = (max(strides) // WIDTH_ALIGNMENT + tiles) * WIDTH_ALIGNMENT
    prior_width = batch.prior_width
    if batch.earlier_width > columns:
        prior_width = columns
    needed = max(prior.num_decode_tokens, prior.num_prefill_tokens)
    rows = max(
        [batch.buffer_rows]
        + [prior.row_offset + 1 + max(-(-(needed * columns - w) // s), 0)
           for w, s in zip(widths, strides)]
    )
    if rows > MAX_BUFFER_ROWS or rows * (max(widths) + pad) > MAX_BUFFER_ELEMENTS:
        return batch
    return dataclasses.replace(batch, buffer_rows=rows, prior_width=prior_width,
                               prior=dataclasses.replace(prior, columns=columns))


def _after(batch: Batch, prior: PriorStep, prior_width: int) -> Batch:
    rows = max(batch.buffer_rows, prior.rows_needed)
    return dataclasses.replace(batch, buffer_rows=rows, prior=prior, prior_width=prior_width)


def _shape_history_examples() -> dict[str, Batch]:
    return {
        # 260 decode requests (a request index past 8 bits), five 64-row
        # blocks, after a C4A-like layer's step of 8 decode and 4 prefill
        # rows (R = 4, B = 64) whose buffers were the other way round, at W = 128.
        "many_decode_rows_after_another_layer": _after(
            engine_batch([(128 * (k + 1) + k % 7, 1) for k in range(260)]),
            PriorStep(8, 4, 4, 64, swapped=True), 128,
        ),
        # 70 prefill rows after a C4A-like layer's step of as many tokens,
        # all decode: the same T split otherwise, no prefill row written before.
        "prefill_rows_after_a_decode_step_of_the_same_t": _after(
            engine_batch([(300, 2)], [(5_000, 70)]), PriorStep(72, 0, 4, 2, row_offset=3), 0,
        ),
        # Speculative decoding (9 decode rows) after a step of fewer rows in
        # the same 64-row block, pages of another block size.
        "speculative_decode_after_fewer_rows": _after(
            engine_batch([(3 * 128 + 7, 8), (2 * 128, 1)], [(600, 2)]),
            PriorStep(5, 1, 128, 3), 256,
        ),
        # A layer of block size 41 (a column's page through the float32
        # reciprocal of B floors wrong from column 41) after the engine's
        # layer (B = 2) used the buffers for more rows in the same block.
        "block_size_41_after_the_engines_layer": _after(
            dataclasses.replace(engine_batch([(60 * 128, 1), (45 * 128 + 3, 2)], [(300, 1)]),
                                block_size=41),
            PriorStep(5, 40, 128, 2), 0,
        ),
    }


SHAPE_HISTORY_EXAMPLES: dict[str, Batch] = _shape_history_examples()
"""Steps with a shape history worth checking first (``history_independent``
runs them after the historical steps): more rows than the step before
across 64-row blocks, another split of the same T, another layer's R and B
and placement."""
