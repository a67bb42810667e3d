"""Inputs as an engine hands them: drawn.

A step's requests, widths and buffers (:mod:`.engine`) say nothing of where
its inputs live or of the values a real engine puts in them. These come
from :data:`ENGINE_INPUT_BYTES` more bytes, drawn after everything else
(so every step of an earlier choice sequence decodes as before, its new
fields at their defaults), each part the engine's usual for half its
values or more and zeros giving the usual step:

- each input a slice of a larger persistent tensor, at a storage offset
  16-byte aligned or not (:class:`~c128a.step.InputPlacement`);
- slot ids of KV pages (page id x page size + offset, unrelated to the
  token's position), below 2^31 or past it;
- block-table rows sharing their leading pages (prefix caching), from
  page 0 (vLLM's null block) or not;
- the decode buffer wider than the prefill buffer (the contract asks only
  0 < W <= both);
- one unsteered small step in :data:`BEYOND_CAPS_ONE_IN` past the
  engine's caps (a steered step aims for its pair cells instead): a few
  tokens at positions up to 2^21 and capacities up to
  :data:`BEYOND_CAPS_CAPACITY` (R = 64 at 1M gives 16,384).

:mod:`.reach` names the buckets (input placement, slot ids, shared pages,
first scheduled position, capacity past 8,192, buffer widths).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..contract import MAX_CAPACITY, PAGE_TOKENS, WIDTH_ALIGNMENT
from ..step import Batch, InputPlacement, PermutedBlockTable
from ..step.inputs import INPUT_ALIGNMENT, ITEM_BYTES
from .layout import Fields

PLACEMENT_BYTES = 4 * 3  # per input: kind (1), offset (2)
SLOT_BYTES = 1 + 4  # kind, page-id seed
SHARED_BYTES = 1 + 2  # kind, shared pages
BEYOND_BYTES = 1 + 2  # kind, model length
WIDTHS_BYTES = 1 + 1  # kind, columns fewer
ENGINE_INPUT_BYTES = PLACEMENT_BYTES + SLOT_BYTES + SHARED_BYTES + BEYOND_BYTES + WIDTHS_BYTES

PLACED_INPUTS = ("positions", "token_to_req_indices", "slot_mapping", "block_table")

MAX_PLACEMENT_STEPS = 512
"""An offset is up to this many 16-byte steps into its persistent tensor."""

KV_PAGES_BELOW_2_31 = 2**31 // PAGE_TOKENS
"""KV pages whose slot ids all lie below 2^31."""

BEYOND_CAPS_ONE_IN = 16
"""One unsteered small step in this many (one small step in about 32) lies
past the engine's caps."""

BEYOND_CAPS_TOKENS = 4
"""The most tokens of a step past the caps: each costs a build of up to
16,384 columns under Triton's interpreter."""

BEYOND_CAPS_CAPACITY = 2 * MAX_CAPACITY
"""The widest capacity drawn (16,384: R = 64 at 1M, or R = 128 at 2M)."""

HALF_OR_MORE = 2
"""A kind byte below this (of 4) keeps the engine's usual value."""


@dataclass(frozen=True)
class EngineInputs:
    """What the extra bytes decide: the placement, the slot ids' kind and
    seed, the shared pages' kind and count, whether the step lies past the
    engine's caps (and the value its model length is drawn from), and how
    many 128-column tiles narrower the prefill buffer is (0: not)."""

    placement: InputPlacement = InputPlacement()
    slot_kind: int = 0  # 0: positions, 1: pages below 2^31, 2: pages at 2^31 and past
    slot_seed: int = 0
    shared_kind: int = 0  # 0: unique, 1: shared leading pages, 2: from page 0
    shared_pages: int = 0
    beyond_caps: bool = False
    beyond_value: int = 0
    narrower_prefill: int = 0


def _offset(name: str, kind: int, value: int) -> int:
    """An element offset into input ``name``'s persistent tensor: 0 for half
    the kinds, else a multiple of 16 bytes or, for the other kind, not."""
    kind %= 4
    if kind < HALF_OR_MORE:
        return 0
    per_step = INPUT_ALIGNMENT // ITEM_BYTES[name]  # elements in 16 bytes
    aligned = per_step * (1 + value % MAX_PLACEMENT_STEPS)
    if kind == 2:
        return aligned
    return aligned - 1 - (value >> 9) % (per_step - 1)  # 1 to per_step - 1 short of a step


PLACEMENT_KINDS = {"offset 0": 0, "offset, 16-byte aligned": 2, "offset, not 16-byte aligned": 3}
"""The :func:`_offset` kind of each placement bucket (:mod:`.reach`)."""

PLACEMENT_DIMENSIONS = {"positions": "positions placement",
                        "token_to_req_indices": "token_to_req_indices placement",
                        "slot_mapping": "slot_mapping placement",
                        "block_table": "block table placement"}

SLOT_KINDS = {"the token's position": 0, "a page's slot, below 2^31": 1,
              "a page's slot, 2^31 and above": 2}
SHARED_KINDS = {"unique pages": 0, "shared leading pages": 1, "the null block 0, shared": 2}


def _steered_kind(kind: int, wanted: str | None, kinds: dict[str, int], of) -> int:
    """``kind`` where the row names no bucket or ``of(kind)`` is already its
    kind, else the bucket's kind (the row steers; :mod:`.schedule`)."""
    if wanted is None or of(kind) == kinds[wanted]:
        return kind
    return kinds[wanted]


def decode_inputs(data: bytes, *, beyond_allowed: bool, steer=None) -> EngineInputs:
    """The :class:`EngineInputs` of :data:`ENGINE_INPUT_BYTES` bytes; zeros
    give the engine's usual step (every default). A row of the covering
    array (``steer``, :class:`~.schedule.Steer`) takes each input's
    placement, the slot ids, the shared pages and a narrower prefill buffer
    where it names them, and places the step past the caps where the
    bytes say so or it asks for a capacity above 8,192 or a first position
    from 2^20 on."""
    fields = Fields(data)
    steer = steer or {}
    offsets = {}
    for name in PLACED_INPUTS:
        kind, value = fields.uint(1), fields.uint(2)
        kind = _steered_kind(kind, steer.get(PLACEMENT_DIMENSIONS[name]), PLACEMENT_KINDS,
                             lambda k: k % 4 if k % 4 >= HALF_OR_MORE else 0)
        offsets[name] = _offset(name, kind, value)
    slot_kind, slot_seed = fields.uint(1) % 4, fields.uint(4)
    slot_kind = max(slot_kind - 1, 0)
    slot_kind = _steered_kind(slot_kind, steer.get("slot ids"), SLOT_KINDS, lambda k: k)
    shared_kind, shared_pages = fields.uint(1) % 4, fields.uint(2)
    shared_kind = max(shared_kind - 1, 0)
    shared_kind = _steered_kind(shared_kind, steer.get("shared pages"), SHARED_KINDS,
                                lambda k: k)
    beyond_kind, beyond_value = fields.uint(1), fields.uint(2)
    beyond = beyond_kind % BEYOND_CAPS_ONE_IN == BEYOND_CAPS_ONE_IN - 1
    # Past the caps where the bytes say so (as unsteered), or the row asks.
    beyond = beyond or steer.get("capacity past 8,192") == "above 8,192" or steer.get(
        "first scheduled position") == "1,048,576 and more"
    widths_kind, fewer = fields.uint(1), fields.uint(1)
    narrower = 1 + fewer % 4 if widths_kind % 4 == 3 else 0
    wanted_widths = steer.get("buffer widths")
    if wanted_widths == "decode wider":
        narrower = 1 + fewer % 4
    elif wanted_widths is not None:
        narrower = 0
    return EngineInputs(
        placement=InputPlacement(**offsets),
        slot_kind=slot_kind,
        slot_seed=slot_seed,
        shared_kind=shared_kind,
        shared_pages=shared_pages,
        beyond_caps=beyond_allowed and beyond,
        beyond_value=beyond_value,
        narrower_prefill=narrower,
    )


def beyond_caps_length(value: int, ratio: int) -> tuple[int, int]:
    """(least, most) max_model_len of a step past the caps at ratio ``ratio``:
    a capacity above 8,192 or positions past 2^20, within
    :data:`BEYOND_CAPS_CAPACITY` columns."""
    most = BEYOND_CAPS_CAPACITY * ratio
    least = min(MAX_CAPACITY * ratio, 1 << 20) + 1
    return least, most


def engine_slot(seed: int, request: int, position: int, past_2_31: bool) -> int:
    """The slot id of a request's token: its page id x the page size plus the
    position within the page. Page ids come from an affine hash of
    (request, page of the sequence), unrelated to the position; below
    2^31 / 256 pages, or (``past_2_31``) from there up to four times past."""
    modulus = KV_PAGES_BELOW_2_31
    page = ((seed | 1) * (request * 65_537 + position // PAGE_TOKENS) + (seed >> 8)) % modulus
    if past_2_31:
        page += modulus * (1 + (seed >> 20) % 3)
    return page * PAGE_TOKENS + position % PAGE_TOKENS


def applied(batch: Batch, inputs: EngineInputs) -> Batch:
    """``batch`` with ``inputs``' placement, slot ids, shared pages and
    narrower prefill buffer (where its width allows one)."""
    if inputs == EngineInputs():
        return batch
    changes: dict = {}
    if not inputs.placement.fresh:
        changes["inputs"] = inputs.placement
    if inputs.slot_kind:
        t = batch.num_tokens
        changes["slot_mapping"] = tuple(
            engine_slot(inputs.slot_seed, r, p, inputs.slot_kind == 2) if s >= 0 else s
            for s, p, r in zip(batch.slot_mapping[:t], batch.positions, batch.token_to_req_indices)
        ) + batch.slot_mapping[t:]
    table = batch.block_table
    if inputs.shared_kind and isinstance(table, PermutedBlockTable) and len(table) >= 2:
        most = max(table.pages_needed)
        if most:
            changes["block_table"] = dataclasses.replace(
                table, shared=1 + inputs.shared_pages % most,
                offset=0 if inputs.shared_kind == 2 else table.offset,
            )
    if inputs.narrower_prefill:
        # The prefill buffer narrower by whole tiles, down to W at most.
        room = (batch.capacity - batch.width) // WIDTH_ALIGNMENT
        if room >= 1:
            extra = -WIDTH_ALIGNMENT * (1 + (inputs.narrower_prefill - 1) % room)
            changes["prefill_extra_columns"] = extra
            widest = batch.capacity + extra
            if batch.prior_width > widest - widest % WIDTH_ALIGNMENT:
                changes["prior_width"] = 0  # the widest the buffers allow now
    return dataclasses.replace(batch, **changes) if changes else batch
