"""History independence: what a build writes does not depend on what its
buffers held before it.

An engine builds every step into the same persistent buffers, so a builder
could skip rows or columns it believes are already right: a memo keyed by the
buffers' address, a "skip if it already holds -1" shortcut, a chunk left
alone because it was idle last step. Every other property builds into fresh
poisoned buffers, where such a shortcut cannot show. This check builds one
step again and again into ONE allocation, each time after giving that memory
other contents, and compares the written region with the oracle each time.

The earlier step may have another shape (other row counts, R and B, another
placement in the memory: the :class:`~c128a.step.PriorStep` a step records,
:mod:`.prior_shape`). The prior contents are a pure function of the step
(:func:`earlier_step`, :func:`~.prior_shape.shaped_earlier_step`,
:func:`fill_seed`), so a failing step saved as JSON replays exactly, without
Hypothesis: the property's input stays a single :class:`~c128a.step.Batch`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import torch

from ..failures import HarnessError, InvariantViolation
from ..step import POISON, Batch, Buffers, build
from .one_build import check_matches_oracle, decode_width, expected_result
from .prior_shape import describe, earlier_buffers, shaped_earlier_step

NAME = "history_independent"

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def widest_width(batch: Batch) -> int:
    """:attr:`~c128a.step.Batch.widest_width`: the widest W the buffers allow."""
    return batch.widest_width


def _last_position(length: int, ratio: int) -> int:
    """The last position p with (p + 1) // R == length (p >= 0)."""
    return max((length + 1) * ratio - 2, 0)


def earlier_step(batch: Batch) -> Batch:
    """The step an engine might have built into the same buffers before
    ``batch``, derived from ``batch`` alone (so a saved case replays it).

    Same buffer geometry (rows, C, prefill buffer, R, B, block table, buffer
    layout), same decode/prefill split, at the step's ``prior_width`` (the
    widest width the buffers allow where it is 0, :func:`widest_width`;
    narrower than, equal to or wider than the step's own W), with different
    rows in every buffer:

    - decode token t gets decode token t' = D - 1 - t's request and length
      n(t') (the decode tokens in reverse order; half that length where t'
      has t's own request and length), at most the entries the block table's
      columns hold, so it stays inside the contract's table precondition;
    - prefill token t gets length W_earlier - n(t): short rows become long
      and long rows short (W_earlier where the two would be equal);
    - padding flips: tokens that are real in ``batch`` are padding (slot -1)
      in the earlier step and padding tokens are real, so every
      ``decode_lens`` entry must be rewritten.

    n(t) is the step's own, at its W. Each token's position is the last one
    with the chosen length.
    """
    d, t = batch.num_decode_tokens, batch.num_tokens
    ratio, width = batch.compress_ratio, batch.earlier_width

    def length(index: int) -> int:
        return min((batch.positions[index] + 1) // ratio, batch.width)

    # A padding token that becomes real reads the table: under the inert
    # variant a stale padding position may reach past what the table covers
    # (its row read no entry), so its length stays within the table's columns.
    reach = batch.table_width * batch.block_size
    lengths, requests = [], list(batch.token_to_req_indices)
    for index in range(d):
        source = d - 1 - index
        own = (batch.token_to_req_indices[index], length(index))
        chosen = (batch.token_to_req_indices[source], length(source))
        requests[index] = chosen[0]
        lengths.append(min(chosen[1] // 2 if chosen == own else chosen[1], reach))
    for index in range(d, t):
        # At a narrower earlier width a long row's mirror is clamped to 0.
        mirrored = max(width - length(index), 0)
        lengths.append(width if mirrored == length(index) else mirrored)
    positions = tuple(_last_position(n, ratio) for n in lengths)
    slots = tuple(
        -1 if batch.slot_mapping[index] >= 0 else positions[index] for index in range(t)
    )
    return dataclasses.replace(
        batch,
        positions=positions,
        token_to_req_indices=tuple(requests),
        slot_mapping=slots + tuple(batch.slot_mapping[t:]),
        width=width,
        prior_width=0,
        prior=None,
        labels=("earlier step",),
    )


def fill_seed(batch: Batch) -> int:
    """A 63-bit seed for the random prior content, from the step's JSON
    (labels left out): a live step and the same step read back from a case
    file give the same seed."""
    data = batch.to_json()
    data.pop("labels", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def random_buffers(batch: Batch, seed: int) -> Buffers:
    """Buffers of ``batch``'s geometry on the CPU holding int32 values drawn
    uniformly from the whole int32 range by a generator seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    shapes = Buffers.for_batch(batch, "meta")

    def draw(like: torch.Tensor) -> torch.Tensor:
        return torch.randint(
            INT32_MIN, INT32_MAX + 1, tuple(like.shape), generator=generator, dtype=torch.int32
        )

    return Buffers(*(draw(buffer) for buffer in shapes.as_tuple()))


def other_writer(buffers: Buffers) -> Buffers:
    """Aliases of ``buffers``' memory that share no version counter with them:
    writes through these are invisible to the buffers' ``_version``, as the
    writes of a CUDA graph replay or another kernel are, so a builder cannot
    learn from torch's bookkeeping that its memory changed."""

    def alias(buffer: torch.Tensor) -> torch.Tensor:
        fresh = torch.empty(0, dtype=buffer.dtype, device=buffer.device)
        return fresh.set_(
            buffer.untyped_storage(), buffer.storage_offset(), buffer.shape, buffer.stride()
        )

    return Buffers(*(alias(buffer) for buffer in buffers.as_tuple()))


def _same_geometry(batch: Batch, earlier: Batch) -> None:
    fields = ("buffer_rows", "capacity", "prefill_extra_columns")
    differ = [f for f in fields if getattr(batch, f) != getattr(earlier, f)]
    if differ:
        raise HarnessError(
            f"the earlier step's buffers differ from the step's in {', '.join(differ)}: "
            "history_independent builds both into one allocation"
        )


def check_history_independent(
    target, batch: Batch, device, earlier: Batch | None = None, seed: int | None = None
) -> None:
    """Invariant: a build's written region (rows < T, columns < W, or < C for
    the decode buffer of a target with full-width decode views, and
    ``decode_lens`` rows < D; in the buffers and in the returned views) equals
    the oracle whatever the buffers held before the build. ``batch`` is built
    four times into ONE allocation, after it held, in turn: the poison of
    fresh buffers, or, for a step that records the shape of the step before
    it (``batch.prior``), that step's result, built into the fresh memory as
    the builder's first call there
    (:func:`~c128a.checks.prior_shape.shaped_earlier_step`, its buffers
    placed as recorded, :func:`~c128a.checks.prior_shape.earlier_buffers`);
    the poison written again over ``batch``'s own result; ``earlier``'s
    result (:func:`earlier_step` by default, built into that memory,
    poisoned again, at the width the step records for it); random int32
    values in every element (a generator seeded with ``seed``,
    :func:`fill_seed` by default). The poison and the random values are
    written through :func:`other_writer`'s aliases. The diff names the prior
    content and the first differing row and column."""
    if batch.num_tokens == 0:
        return  # nothing is written
    earlier = earlier_step(batch) if earlier is None else earlier
    seed = fill_seed(batch) if seed is None else seed
    _same_geometry(batch, earlier)
    buffers = Buffers.for_batch(batch, device)
    memory = tuple(buffer.data_ptr() for buffer in buffers.as_tuple())
    outside = other_writer(buffers)  # what writes the prior contents
    expected = None

    def build_and_compare(prior: str) -> None:
        nonlocal expected
        result = build(target, batch, device, buffers=buffers)
        if expected is None:
            columns = decode_width(target, result)
            expected = expected_result(target, batch, result.width, "cpu", columns)
        try:
            check_matches_oracle(target, result, expected)
        except InvariantViolation as exc:
            raise InvariantViolation(
                NAME, f"after the buffers held {prior}: {exc.detail}"
            ) from None

    if batch.prior is None:
        build_and_compare(f"the poison {POISON} (fresh buffers)")
    else:
        # First into the memory: a builder that keeps state per set of
        # buffers (a scratch, a launch grid, a geometry) sets it up then.
        shaped = shaped_earlier_step(batch)
        build(target, shaped, device, buffers=earlier_buffers(buffers, batch.prior))
        build_and_compare(
            f"an earlier step's result of another shape (c128a.checks.prior_shape."
            f"shaped_earlier_step of this step: {describe(batch.prior)}; W={shaped.width}, "
            f"T={shaped.num_tokens}, built into the fresh memory, the builder's first call there)"
        )
    outside.fill_(POISON)
    build_and_compare(f"the poison {POISON} again (written over this step's own result)")
    outside.fill_(POISON)  # the earlier step's result alone, whatever ran before
    build(target, earlier, device, buffers=buffers)
    build_and_compare(
        f"an earlier step's result (c128a.checks.earlier_step of this step: W={earlier.width}, "
        f"T={earlier.num_tokens}, num_decode_tokens={earlier.num_decode_tokens}, built into "
        "the same memory)"
    )
    outside.copy_(random_buffers(batch, seed))
    build_and_compare(f"random int32 values (torch.Generator seed {seed}, same memory)")
    if tuple(buffer.data_ptr() for buffer in buffers.as_tuple()) != memory:
        raise HarnessError("history_independent's buffers moved between builds")
