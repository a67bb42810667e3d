"""An earlier step of another shape, built into the same buffers.

:func:`shaped_earlier_step` derives, from a step and the
:class:`~c128a.step.PriorStep` it records, the whole step an engine built
into the same buffers before it: other decode and prefill row counts,
another compress ratio and block size (a layer of another geometry), at the
step's ``prior_width``. :func:`earlier_buffers` places that step's buffers
in the step's memory as the record says (swapped, a row offset). Both are
pure functions of the saved :class:`~c128a.step.Batch`, so a case replays
the same history without Hypothesis.
"""

from __future__ import annotations

import dataclasses

from ..step import Batch, Buffers, PermutedBlockTable, PriorStep, page_modulus

DECODE_TOKENS_A_REQUEST = 2
"""The earlier step's decode requests have two tokens each (speculative
decoding), so rows of one request share block-table rows."""

LENGTH_STRIDE = 37
"""Consecutive earlier rows' lengths lie this far apart (mod W + 1): long
and short rows mixed, every residue reached for any W."""


def _first_position(length: int, ratio: int) -> int:
    """The first position p with (p + 1) // R == length (0 for length 0,
    which at R = 1 attends to one entry)."""
    return max(length * ratio - 1, 0)


def _lengths(count: int, longest: int, start: int) -> list[int]:
    """``count`` list lengths in [0, ``longest``], mostly long: what a step of
    long sequences leaves in the buffers past a shorter step's lists."""
    return [longest - (start + LENGTH_STRIDE * i) % (longest + 1) for i in range(count)]


def shaped_earlier_step(batch: Batch, prior: PriorStep | None = None) -> Batch:
    """The step ``prior`` (``batch.prior`` by default) describes, as built
    into ``batch``'s buffers before it, at ``batch.earlier_width``.

    Decode tokens come two to a request, with lengths from long to short
    (every length at most min(W, max_model_len // R): positions stay below
    the model length), padding every fifth token (slot -1); the block table
    holds unique pages modulo :func:`~c128a.step.page_modulus` of its block
    size, covering every decode token's list (padding rows included, as the
    ``slots`` variant reads them). Prefill tokens get lengths of their own
    pattern. The step is inside the contract for both padding-row variants.
    """
    prior = batch.prior if prior is None else prior
    ratio, block = prior.compress_ratio, prior.block_size
    width = batch.earlier_width
    longest = max(min(width, batch.max_model_len // ratio), 0)
    decode = _lengths(prior.num_decode_tokens, longest, 0)
    prefill = _lengths(prior.num_prefill_tokens, longest, longest // 2)
    positions = tuple(_first_position(n, ratio) for n in decode + prefill)
    attended = [min((p + 1) // ratio, width) for p in positions]
    requests = [t // DECODE_TOKENS_A_REQUEST for t in range(len(decode))]
    pages_needed = [0] * (-(-len(decode) // DECODE_TOKENS_A_REQUEST))
    for token, request in enumerate(requests):
        pages_needed[request] = max(pages_needed[request], -(-attended[token] // block))
    table = ()
    if pages_needed:
        table = PermutedBlockTable(
            pages_needed=tuple(pages_needed), width=max(max(pages_needed), 1),
            scale=LENGTH_STRIDE, offset=3, prime=page_modulus(block, sum(pages_needed)),
        )
    requests += [len(pages_needed) + t for t in range(len(prefill))]
    slots = tuple(-1 if t % 5 == 4 else p for t, p in enumerate(positions))
    return dataclasses.replace(
        batch,
        positions=positions,
        num_decode_tokens=len(decode),
        token_to_req_indices=tuple(requests),
        block_table=table,
        block_table_row_stride=0,
        slot_mapping=slots,
        width=width,
        compress_ratio=ratio,
        block_size=block,
        prior_width=0,
        prior=None,
        labels=("earlier step",),
    )


def earlier_buffers(buffers: Buffers, prior: PriorStep | None) -> Buffers:
    """Where the earlier step's buffers sat in ``buffers``' memory: the decode
    and prefill buffers the other way round where ``prior.swapped``, each
    from row ``prior.row_offset``, and with ``prior.columns`` each 2-D
    buffer viewed from that same first address as dense rows of that many
    columns (another capacity and row stride at the address: as many rows
    as the buffer's memory holds); ``buffers`` themselves without a prior."""
    if prior is None or (not prior.swapped and not prior.row_offset and not prior.columns):
        return buffers
    decode, lens, prefill = buffers.as_tuple()
    if prior.swapped:
        decode, prefill = prefill, decode
    start = prior.row_offset
    decode, lens, prefill = decode[start:], lens[start:], prefill[start:]
    if prior.columns:
        decode, prefill = (reshaped(buffer, prior.columns) for buffer in (decode, prefill))
    return Buffers(decode, lens, prefill)


def reshaped(buffer, columns: int):
    """``buffer``'s memory from its first element as dense rows of ``columns``
    columns: as many rows as fit before the end of its last row."""
    extent = (buffer.shape[0] - 1) * buffer.stride(0) + buffer.shape[1] if buffer.shape[0] else 0
    return buffer.as_strided((extent // columns, columns), (columns, 1))


def describe(prior: PriorStep | None) -> str:
    """The earlier step's shape in words, for a diff's first line."""
    if prior is None:
        return "the same shape"
    placed = []
    if prior.swapped:
        placed.append("its decode and prefill buffers swapped")
    if prior.row_offset:
        placed.append(f"from row {prior.row_offset}")
    if prior.columns:
        placed.append(f"its buffers {prior.columns} columns wide (row stride {prior.columns}) "
                      "at the same addresses")
    return (
        f"num_decode_tokens={prior.num_decode_tokens}, "
        f"num_prefill_tokens={prior.num_prefill_tokens}, R={prior.compress_ratio}, "
        f"B={prior.block_size}" + ("; " + ", ".join(placed) if placed else "")
    )
