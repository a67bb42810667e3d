"""Steps that reach what the draws of the ci profile miss in the project's
kernels, for ``@example``: each kills a mutant of the kernels (``c128a
mutate``) that survived every property's draws, and names it.
"""

from __future__ import annotations

import dataclasses

from ..step import Batch
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


KERNEL_EXAMPLES: dict[str, Batch] = {
    "slot_zero_in_a_wide_row": _slot_zero_in_a_wide_row(),
    "slot_zero_in_a_narrow_row": _slot_zero_in_a_narrow_row(),
}
"""Name -> step; ``matches_oracle`` runs them after the historical steps."""
