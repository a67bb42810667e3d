"""Steps that reach what the draws of the ci profile miss, for
``@example``: each kills a mutant that survived every property's draws on
one device (a mutant of the project's kernels, ``c128a mutate``, or a
project mutant on the GPU budget's draws, which differ from the CPU's), and
names it.
"""

from __future__ import annotations

import dataclasses

from ..contract import COMPRESS_RATIO
from ..step import Batch, BufferLayout
from .history import engine_batch


def _slot_zero_in_a_wide_row() -> Batch:
    # A real decode token whose slot id is 0 (page 0, offset 0: an engine's
    # slot follows its page, not its position) with 1,100 entries, so W =
    # 2,048 and the wide-rows kernel writes its row. Under ``inert`` a
    # builder that takes slot 0 for padding blanks it (adaptive-01e92963:
    # ``slot_id < 0`` -> ``slot_id <= 0``); the draws' slots follow their
    # positions (position 0 has no entry at R = 128) or a hashed page, which
    # is page 0 about once in 2^23 draws.
    step = engine_batch([(1_100 * 128, 1), (600, 1)], [(700, 2)], max_model_len=1_048_576)
    return dataclasses.replace(step, slot_mapping=(0, *step.slot_mapping[1:]))


def _slot_zero_in_a_narrow_row() -> Batch:
    # The same below the wide-rows width (W = 128: the row-blocks kernel,
    # whose tile reads the slot ids itself): under ``inert`` a builder that
    # takes slot 0 for padding blanks the row (adaptive-daa7a85a,
    # adaptive-41309c0f: ``slot_ids >= 0`` -> ``> 0``, ``>= 1``), and under
    # either variant one that zeroes its length (adaptive-ed0defb8,
    # adaptive-bec98a28: ``slot_ids < 0`` -> ``<= 0``, ``< 1``).
    step = engine_batch([(600, 1), (700, 1)], [(700, 2)])
    return dataclasses.replace(step, slot_mapping=(0, *step.slot_mapping[1:]))


def _pages_wider_than_a_tile() -> Batch:
    # 300 entries on pages of 256 (B > 128): columns 128 to 299 are on the
    # first page past its 128th entry and on the second page. A builder that
    # finds a column's page within its 128-column tile, as if no page
    # spanned two tiles, reads wrong pages there (mutant
    # block_size_capped_at_tile; the GPU budget's draws missed it).
    return engine_batch([(300 * COMPRESS_RATIO, 1)], block_size=256, buffer_rows=3)


def _rows_further_apart_than_the_capacity() -> Batch:
    # One decode token in pooled buffers whose rows are 131 columns further
    # apart than C (an engine's padded pool), at W = 128 < C. A builder
    # that takes the room between two rows for the row's width writes past
    # W there (mutant clamp_to_row_stride; the GPU budget's draws missed it).
    return engine_batch([(1_000, 1)], buffer_rows=14,
                        buffer_layout=BufferLayout(offset=16, row_padding=131, pooled=True))


KERNEL_EXAMPLES: dict[str, Batch] = {
    "slot_zero_in_a_wide_row": _slot_zero_in_a_wide_row(),
    "slot_zero_in_a_narrow_row": _slot_zero_in_a_narrow_row(),
    "pages_wider_than_a_tile": _pages_wider_than_a_tile(),
}
"""Name -> step; ``matches_oracle`` runs them after the historical steps."""

LAYOUT_EXAMPLES: dict[str, Batch] = {
    "rows_further_apart_than_the_capacity": _rows_further_apart_than_the_capacity(),
}
"""Name -> step; ``untouched_memory`` runs them after the historical steps."""
