"""Deliberately broken targets: proof that the suite can fail.

Each mutant has exactly one fault and reproduces one bug class of the
contract's table. Every mutant is a module-level namespace with a
``build_c128a_topk_metadata`` (and, where the fault is in the width policy,
``active_topk_width`` / ``capacity_width``), so ``c128a.mutants:NAME`` is a
target spec. They are pure torch on top of the oracle's arithmetic: fast,
and runnable on CPU and CUDA tensors alike.

:data:`MUTANTS` describes each, :data:`BUG_CLASSES` names the row of the
contract's table it reproduces, and :data:`TARGETED_INVARIANTS` lists the
properties (:mod:`c128a.properties`) that must kill it.
"""

from __future__ import annotations

import itertools
import types

import torch

from . import policy
from .reference import attended_lengths, build_c128a_topk_metadata as _reference_build
from .reference import returned_views
from .validation import check_build_arguments

__all__ = ["BUG_CLASSES", "MUTANTS", "TARGETED_INVARIANTS"]

SENTINEL = -1
DEFAULT_WIDTH = 8192  # the kernel signature's default max_compressed_tokens


def _rows(
    positions,
    compress_ratio,
    num_decode,
    token_to_req_indices,
    block_table,
    block_size,
    slot_mapping,
    width,
    *,
    columns=None,
    lengths=None,
    request_rows=None,
    table=None,
    sentinel=SENTINEL,
    zero_padding_lens=True,
):
    """The oracle's rows, with one piece replaceable: (decode [D, columns],
    lens [D], prefill [T - D, columns]) as int32. ``columns`` defaults to W."""
    columns = width if columns is None else columns
    device = positions.device
    if lengths is None:
        lengths = attended_lengths(positions, compress_ratio, width)
    index = torch.arange(columns, device=device, dtype=torch.int64)
    active = index.unsqueeze(0) < lengths.unsqueeze(1)
    fill = torch.tensor(sentinel, device=device, dtype=torch.int64)
    table = block_table if table is None else table
    if request_rows is None:
        request_rows = token_to_req_indices[:num_decode].to(torch.int64)
    if num_decode and table.shape[1]:
        pages = table.index_select(0, request_rows).to(torch.int64)
        page_columns = (index // block_size).clamp(max=table.shape[1] - 1)
        pages = pages.gather(1, page_columns.expand(num_decode, columns))
    else:
        pages = torch.zeros(num_decode, columns, device=device, dtype=torch.int64)
    slots = pages * block_size + index % block_size
    decode = torch.where(active[:num_decode], slots, fill).to(torch.int32)
    lens = lengths[:num_decode]
    if zero_padding_lens:
        lens = torch.where(slot_mapping[:num_decode] < 0, torch.zeros_like(lens), lens)
    prefill = torch.where(active[num_decode:], index, fill).to(torch.int32)
    return decode, lens.to(torch.int32), prefill


def _rows_of(args, **fault):
    """:func:`_rows` for a builder's positional arguments."""
    (positions, ratio, d, req, table, block, slots, _, _, _, width) = args
    return _rows(positions, ratio, d, req, table, block, slots, width, **fault)


def _write_and_return(args, rows):
    """Write rows the contract's way and return the contract's views."""
    (positions, _, d, _, _, _, _, dbuf, lbuf, pbuf, width) = args
    _write(dbuf, lbuf, pbuf, *rows)
    return returned_views(dbuf, lbuf, pbuf, positions.shape[0], d, width)


def _write(decode_buffer, lens_buffer, prefill_buffer, decode, lens, prefill):
    d, p = decode.shape[0], prefill.shape[0]
    decode_buffer[:d, : decode.shape[1]] = decode
    lens_buffer[:d] = lens
    prefill_buffer[:p, : prefill.shape[1]] = prefill


def _mutant(description: str, bug_class: str, invariants: tuple[str, ...]):
    """Register a faulty builder (and optional policy) as a module-level mutant."""

    def register(build):
        name = build.__name__.removeprefix("_build_")
        namespace = types.SimpleNamespace(build_c128a_topk_metadata=build)
        globals()[name] = namespace
        MUTANTS[name] = description
        BUG_CLASSES[name] = bug_class
        TARGETED_INVARIANTS[name] = invariants
        return namespace

    return register


MUTANTS: dict[str, str] = {}
"""Mutant name -> what its one fault is."""
BUG_CLASSES: dict[str, str] = {}
"""Mutant name -> the bug class (row of the contract's table) it reproduces."""
TARGETED_INVARIANTS: dict[str, tuple[str, ...]] = {}
"""Mutant name -> the properties that must kill it under the ci profile."""


def _validated(args) -> None:
    check_build_arguments(*args)


# --------------------------------------------------------------------------- builder faults


@_mutant(
    "writes decode and prefill rows at row stride W, not the buffer's, and returns "
    "packed (stride W) views, as the reverted change did",
    "packed stride",
    ("views", "matches_oracle"),
)
def _build_packed_stride(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    decode, lens, prefill = _rows(positions, ratio, d, req, table, block, slots, width)
    t = positions.shape[0]
    packed_decode = dbuf.as_strided((d, width), (width, 1))
    packed_prefill = pbuf.as_strided((t - d, width), (width, 1))
    packed_decode.copy_(decode)
    lbuf[:d] = lens
    packed_prefill.copy_(prefill)
    return packed_decode, lbuf[:d], packed_prefill


@_mutant(
    "writes every column up to the buffer's capacity (-1 past n(t)), not just < W: "
    "the loop runs past the row's active width",
    "spill past the row",
    ("untouched_memory",),
)
def _build_spill_past_width(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    capacity = min(dbuf.shape[1], pbuf.shape[1])
    rows = _rows(positions, ratio, d, req, table, block, slots, width, columns=capacity)
    _write(dbuf, lbuf, pbuf, *rows)
    return returned_views(dbuf, lbuf, pbuf, positions.shape[0], d, width)


@_mutant(
    "writes prefill rows at the decode buffer's row stride: the two buffers' strides "
    "mixed up, wrong only when the prefill buffer is wider",
    "packed stride",
    ("matches_oracle", "untouched_memory"),
)
def _build_prefill_at_decode_stride(*args):
    _validated(args)
    (positions, _, d, _, _, _, _, dbuf, lbuf, pbuf, width) = args
    decode, lens, prefill = _rows_of(args)
    _write(dbuf, lbuf, pbuf[:0], decode, lens, prefill[:0])
    # The strategies only ever widen the prefill buffer, so this stays inside it.
    misplaced = torch.as_strided(pbuf, (prefill.shape[0], width), (dbuf.stride(0), 1))
    misplaced.copy_(prefill)
    return returned_views(dbuf, lbuf, pbuf, positions.shape[0], d, width)


@_mutant(
    "writes 8,192 columns per row (the signature's default) at the buffer's row "
    "stride, so a narrower buffer's row spills into the rows after it",
    "spill past the row",
    ("untouched_memory",),
)
def _build_spill_to_default_width(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    decode, lens, prefill = _rows(
        positions, ratio, d, req, table, block, slots, width, columns=DEFAULT_WIDTH
    )
    for buffer, rows in ((dbuf, decode), (pbuf, prefill)):
        flat = buffer.view(-1)
        stride = buffer.stride(0)
        for row in range(rows.shape[0]):
            start = row * stride
            end = min(start + DEFAULT_WIDTH, flat.shape[0])
            flat[start:end] = rows[row, : end - start]
    lbuf[:d] = lens
    return returned_views(dbuf, lbuf, pbuf, positions.shape[0], d, width)


@_mutant(
    "n(t) = min(floor(p / R), W): forgets the + 1, so a token whose (p + 1) % 128 == 0 "
    "loses its newest compressed entry",
    "off-by-one in n(t)",
    ("matches_oracle", "adaptive_equals_full"),
)
def _build_off_by_one_length(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    lengths = torch.clamp(positions.to(torch.int64) // ratio, max=width)
    return _write_and_return(args, _rows_of(args, lengths=lengths))


@_mutant(
    "decode_lens = n(t) for CUDA-graph padding tokens too (slot_mapping < 0 ignored)",
    "padding tokens",
    ("padding", "matches_oracle"),
)
def _build_lens_ignore_padding(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    rows = _rows(positions, ratio, d, req, table, block, slots, width, zero_padding_lens=False)
    _write(dbuf, lbuf, pbuf, *rows)
    return returned_views(dbuf, lbuf, pbuf, positions.shape[0], d, width)


@_mutant(
    "decode token t reads block-table row t (its token index, clamped to the table) "
    "instead of row token_to_req_indices[t]: wrong with speculative decoding",
    # The same symptom: one request per batch, never the first, reads another's pages.
    "packed stride",
    ("matches_oracle",),
)
def _build_wrong_request_row(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    last_row = max(table.shape[0] - 1, 0)
    rows = torch.arange(d, device=positions.device, dtype=torch.int64).clamp(max=last_row)
    return _write_and_return(args, _rows_of(args, request_rows=rows))


@_mutant(
    "reads the block table as if dense (row stride = its width), so a slice of a "
    "wider table gives every request after the first the wrong pages",
    "packed stride",
    ("matches_oracle",),
)
def _build_ignores_table_row_stride(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    dense = table.as_strided(table.shape, (table.shape[1], 1)) if table.numel() else table
    return _write_and_return(args, _rows_of(args, table=dense))


@_mutant(
    "fills columns [n(t), W) with 0 instead of the -1 sentinel",
    "padding tokens",
    ("padding", "matches_oracle"),
)
def _build_zero_padding(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    return _write_and_return(args, _rows_of(args, sentinel=0))


@_mutant(
    "writes prefill token t at prefill row t, not t - num_decode_tokens",
    "packed stride",  # prefill row 0 landing where another row is read
    ("matches_oracle", "untouched_memory"),
)
def _build_prefill_row_offset(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    decode, lens, prefill = _rows(positions, ratio, d, req, table, block, slots, width)
    t = positions.shape[0]
    dbuf[:d, :width] = decode
    lbuf[:d] = lens
    pbuf[d:t, :width] = prefill
    return returned_views(dbuf, lbuf, pbuf, t, d, width)


@_mutant(
    "returns views at the full capacity C instead of W (without declaring "
    "full_width_decode_views)",
    "contiguity on another consumer",
    ("views",),
)
def _build_full_capacity_views(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    _write(dbuf, lbuf, pbuf, *_rows(positions, ratio, d, req, table, block, slots, width))
    t = positions.shape[0]
    return dbuf[:d], lbuf[:d], pbuf[: t - d]


@_mutant(
    "a token's block-table row is its request index minus the first decode token's "
    "(modulo the rows): right only while the batch starts with request 0",
    "batch-dependent width",
    ("independent",),
)
def _build_batch_dependent_values(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    rows = req[:d].to(torch.int64)
    if d and table.shape[0]:
        rows = (rows - rows[0]) % table.shape[0]
    return _write_and_return(args, _rows_of(args, request_rows=rows))


_calls = itertools.count()


@_mutant(
    "double-buffers: every other call writes (and returns views of) the rows after "
    "the previous call's, so views move between steps and a captured graph reads "
    "stale rows",
    "packed stride",  # a captured consumer reads rows the step did not write
    ("idempotent",),
)
def _build_ping_pong_rows(*args):
    _validated(args)
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    decode, lens, prefill = _rows(positions, ratio, d, req, table, block, slots, width)
    t = positions.shape[0]
    odd = next(_calls) % 2 == 1
    room = dbuf.shape[0] >= 2 * d and lbuf.shape[0] >= 2 * d and pbuf.shape[0] >= 2 * (t - d)
    shift_d, shift_p = (d, t - d) if odd and room else (0, 0)
    dbuf[shift_d : shift_d + d, :width] = decode
    lbuf[shift_d : shift_d + d] = lens
    pbuf[shift_p : shift_p + t - d, :width] = prefill
    return (
        dbuf[shift_d : shift_d + d, :width],
        lbuf[shift_d : shift_d + d],
        pbuf[shift_p : shift_p + t - d, :width],
    )


@_mutant(
    "checks none of its arguments: bad widths, dtypes and counts are written or "
    "crash instead of raising a ValueError",
    "unaligned width",
    ("rejects_bad_input",),
)
def _build_no_validation(*args):
    (positions, ratio, d, req, table, block, slots, dbuf, lbuf, pbuf, width) = args
    return _write_and_return(args, _rows_of(args))


# --------------------------------------------------------------------------- policy faults


def _policy_mutant(
    name, description, bug_class, invariants, *, active_topk_width=None, capacity_width=None
):
    namespace = types.SimpleNamespace(build_c128a_topk_metadata=_reference_build)
    if active_topk_width is not None:
        namespace.active_topk_width = active_topk_width
    if capacity_width is not None:
        namespace.capacity_width = capacity_width
    globals()[name] = namespace
    MUTANTS[name] = description
    BUG_CLASSES[name] = bug_class
    TARGETED_INVARIANTS[name] = invariants
    return namespace


def _width_without_floor(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    needed = max(max_seq_len // compress_ratio, 1)
    return min(policy.next_power_of_2(needed), capacity)


def _width_undercovers(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    # Off by one: the entries of the last position, (max_seq_len - 1) // R.
    needed = max((max_seq_len - 1) // compress_ratio, 1)
    return min(max(policy.next_power_of_2(needed), policy.WIDTH_ALIGNMENT), capacity)


def _unaligned_capacity(max_model_len, compress_ratio=policy.COMPRESS_RATIO):
    return -(-max_model_len // compress_ratio)


def _width_for_any_capacity(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    needed = max(max_seq_len // compress_ratio, 1)
    return min(max(policy.next_power_of_2(needed), policy.WIDTH_ALIGNMENT), capacity)


def _ignores_batch_invariant(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    return policy.active_topk_width(max_seq_len, compress_ratio, capacity, batch_invariant=False)


def _asserts_at_capture_edge(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    needed = max_seq_len // compress_ratio
    width = min(max(policy.next_power_of_2(max(needed, 1)), policy.WIDTH_ALIGNMENT), capacity)
    if batch_invariant is None:
        batch_invariant = policy.batch_invariant_from_env()
    if batch_invariant:
        width = capacity
    assert width >= needed, f"W={width} < {needed}"
    return width


def _clamps_at_capture_edge(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    # Silently caps at the capacity instead of refusing: cuts the lists.
    clamped = min(max_seq_len, capacity * compress_ratio)
    return policy.active_topk_width(
        clamped, compress_ratio, capacity, batch_invariant=batch_invariant
    )


_policy_mutant(
    "width_without_floor",
    "W = min(next_power_of_2(max_seq_len // R), C) without the 128 floor: widths 1..64",
    "unaligned width",
    ("width_policy",),
    active_topk_width=_width_without_floor,
)
_policy_mutant(
    "width_undercovers",
    "W from (max_seq_len - 1) // R: one entry short when max_seq_len // R is a power of "
    "two plus one, cutting the longest token's list",
    "capture at the edge",
    ("width_policy",),
    active_topk_width=_width_undercovers,
)
_policy_mutant(
    "unaligned_capacity",
    "C = ceil(max_model_len / R), not rounded up to a multiple of 128",
    "unaligned width",
    ("width_policy",),
    active_topk_width=_width_for_any_capacity,
    capacity_width=_unaligned_capacity,
)
_policy_mutant(
    "ignores_batch_invariant",
    "the policy follows max_seq_len even in batch-invariant mode (VLLM_BATCH_INVARIANT), "
    "so a token's output depends on its neighbours",
    "batch-dependent width",
    ("width_policy",),
    active_topk_width=_ignores_batch_invariant,
)
_policy_mutant(
    "asserts_at_capture_edge",
    "a capture step past the capacity's reach fails an assert (AssertionError) instead "
    "of the policy's clear ValueError",
    "capture at the edge",
    ("width_policy",),
    active_topk_width=_asserts_at_capture_edge,
)
_policy_mutant(
    "clamps_at_capture_edge",
    "a capture step past the capacity's reach silently gets W = C, shorter than "
    "max_seq_len // R, instead of a clear refusal",
    "capture at the edge",
    ("width_policy",),
    active_topk_width=_clamps_at_capture_edge,
)
