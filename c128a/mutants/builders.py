"""Builder faults: each mutant computes the oracle's rows with one piece
wrong, or writes them to the wrong place, or returns the wrong views."""

from __future__ import annotations

import itertools

import torch

from ..contract import (
    BLOCK_SIZE,
    COMPRESS_RATIO,
    INERT,
    SENTINEL,
    BuildArgs,
    Views,
    attended_lengths,
    returned_views,
)
from ..contract import check_build_arguments as validated
from ..contract.sizes import DEFAULT_WIDTH
from .registry import builder_mutant


def rows_of(
    args: BuildArgs,
    *,
    columns=None,
    lengths=None,
    request_rows=None,
    table=None,
    sentinel=SENTINEL,
    zero_padding_lens=True,
    inert_padding=False,
):
    """The oracle's rows, with one piece replaceable: (decode [D, columns],
    lens [D], prefill [T - D, columns]) as int32. ``columns`` defaults to W;
    ``inert_padding`` gives padding tokens' decode rows no active column
    (the ``inert`` variant; the ``slots`` variant's rows by default)."""
    width = args.max_compressed_tokens
    num_decode = args.num_decode_tokens
    columns = width if columns is None else columns
    device = args.positions.device
    if lengths is None:
        lengths = attended_lengths(args.positions, args.compress_ratio, width)
    index = torch.arange(columns, device=device, dtype=torch.int64)
    active = index.unsqueeze(0) < lengths.unsqueeze(1)
    if inert_padding:
        active[:num_decode] &= (args.slot_mapping[:num_decode] >= 0).unsqueeze(1)
    fill = torch.tensor(sentinel, device=device, dtype=torch.int64)
    table = args.block_table if table is None else table
    if request_rows is None:
        request_rows = args.token_to_req_indices[:num_decode].to(torch.int64)
    if num_decode and table.shape[1]:
        pages = table.index_select(0, request_rows).to(torch.int64)
        page_columns = (index // args.block_size).clamp(max=table.shape[1] - 1)
        pages = pages.gather(1, page_columns.expand(num_decode, columns))
    else:
        pages = torch.zeros(num_decode, columns, device=device, dtype=torch.int64)
    slots = pages * args.block_size + index % args.block_size
    decode = torch.where(active[:num_decode], slots, fill).to(torch.int32)
    lens = lengths[:num_decode]
    if zero_padding_lens:
        lens = torch.where(args.slot_mapping[:num_decode] < 0, torch.zeros_like(lens), lens)
    prefill = torch.where(active[num_decode:], index, fill).to(torch.int32)
    return decode, lens.to(torch.int32), prefill


def write(args: BuildArgs, decode, lens, prefill) -> None:
    """Write rows where the contract says: rows from 0 of each buffer."""
    d, p = decode.shape[0], prefill.shape[0]
    args.global_decode_buffer[:d, : decode.shape[1]] = decode
    args.decode_lens_buffer[:d] = lens
    args.prefill_buffer[:p, : prefill.shape[1]] = prefill


def write_and_return(args: BuildArgs, rows) -> Views:
    """Write rows the contract's way and return the contract's views."""
    write(args, *rows)
    return returned_views(args)


@builder_mutant(
    "writes decode and prefill rows at row stride W, not the buffer's, and returns "
    "packed (stride W) views, as the reverted change did",
    "packed stride",
    ("views", "matches_oracle"),
)
def _build_packed_stride(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    d, t, width = args.num_decode_tokens, args.num_tokens, args.max_compressed_tokens
    packed_decode = args.global_decode_buffer.as_strided((d, width), (width, 1))
    packed_prefill = args.prefill_buffer.as_strided((t - d, width), (width, 1))
    packed_decode.copy_(decode)
    args.decode_lens_buffer[:d] = lens
    packed_prefill.copy_(prefill)
    return Views(packed_decode, args.decode_lens_buffer[:d], packed_prefill)


@builder_mutant(
    "writes every column up to the buffer's capacity (-1 past n(t)), not just < W: "
    "the loop runs past the row's active width",
    "spill past the row",
    ("untouched_memory",),
)
def _build_spill_past_width(args: BuildArgs) -> Views:
    validated(args)
    capacity = min(args.global_decode_buffer.shape[1], args.prefill_buffer.shape[1])
    return write_and_return(args, rows_of(args, columns=capacity))


@builder_mutant(
    "writes prefill rows at the decode buffer's row stride: the two buffers' strides "
    "mixed up, wrong only when the prefill buffer is wider",
    "packed stride",
    ("matches_oracle", "untouched_memory"),
)
def _build_prefill_at_decode_stride(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    write(args, decode, lens, prefill[:0])
    # The strategies only ever widen the prefill buffer, so this stays inside it.
    misplaced = torch.as_strided(
        args.prefill_buffer,
        (prefill.shape[0], args.max_compressed_tokens),
        (args.global_decode_buffer.stride(0), 1),
    )
    misplaced.copy_(prefill)
    return returned_views(args)


@builder_mutant(
    "writes 8,192 columns per row (the signature's default) at the buffer's row "
    "stride, so a narrower buffer's row spills into the rows after it",
    "spill past the row",
    ("untouched_memory",),
)
def _build_spill_to_default_width(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args, columns=DEFAULT_WIDTH)
    for buffer, rows in ((args.global_decode_buffer, decode), (args.prefill_buffer, prefill)):
        flat = buffer.view(-1)
        stride = buffer.stride(0)
        for row in range(rows.shape[0]):
            start = row * stride
            end = min(start + DEFAULT_WIDTH, flat.shape[0])
            flat[start:end] = rows[row, : end - start]
    args.decode_lens_buffer[: args.num_decode_tokens] = lens
    return returned_views(args)


@builder_mutant(
    "n(t) = min(floor(p / R), W): forgets the + 1, so a token whose (p + 1) % 128 == 0 "
    "loses its newest compressed entry",
    "off-by-one in n(t)",
    ("matches_oracle", "adaptive_equals_full"),
)
def _build_off_by_one_length(args: BuildArgs) -> Views:
    validated(args)
    lengths = torch.clamp(
        args.positions.to(torch.int64) // args.compress_ratio, max=args.max_compressed_tokens
    )
    return write_and_return(args, rows_of(args, lengths=lengths))


@builder_mutant(
    "decode_lens = n(t) for CUDA-graph padding tokens too (slot_mapping < 0 ignored)",
    "padding tokens",
    ("padding", "matches_oracle"),
)
def _build_lens_ignore_padding(args: BuildArgs) -> Views:
    validated(args)
    return write_and_return(args, rows_of(args, zero_padding_lens=False))


@builder_mutant(
    "decode token t reads block-table row t (its token index, clamped to the table) "
    "instead of row token_to_req_indices[t]: wrong with speculative decoding",
    # The same symptom: one request per batch, never the first, reads another's pages.
    "packed stride",
    ("matches_oracle",),
)
def _build_wrong_request_row(args: BuildArgs) -> Views:
    validated(args)
    last_row = max(args.block_table.shape[0] - 1, 0)
    rows = torch.arange(args.num_decode_tokens, device=args.positions.device, dtype=torch.int64)
    return write_and_return(args, rows_of(args, request_rows=rows.clamp(max=last_row)))


@builder_mutant(
    "reads the block table as if dense (row stride = its width), so a slice of a "
    "wider table gives every request after the first the wrong pages",
    "packed stride",
    ("matches_oracle",),
)
def _build_ignores_table_row_stride(args: BuildArgs) -> Views:
    validated(args)
    table = args.block_table
    dense = table.as_strided(table.shape, (table.shape[1], 1)) if table.numel() else table
    return write_and_return(args, rows_of(args, table=dense))


@builder_mutant(
    "fills columns [n(t), W) with 0 instead of the -1 sentinel",
    "padding tokens",
    ("padding", "matches_oracle"),
)
def _build_zero_padding(args: BuildArgs) -> Views:
    validated(args)
    return write_and_return(args, rows_of(args, sentinel=0))


@builder_mutant(
    "writes prefill token t at prefill row t, not t - num_decode_tokens",
    "packed stride",  # prefill row 0 landing where another row is read
    ("matches_oracle", "untouched_memory"),
)
def _build_prefill_row_offset(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    d, t, width = args.num_decode_tokens, args.num_tokens, args.max_compressed_tokens
    args.global_decode_buffer[:d, :width] = decode
    args.decode_lens_buffer[:d] = lens
    args.prefill_buffer[d:t, :width] = prefill
    return returned_views(args)


@builder_mutant(
    "returns views at the full capacity C instead of W (without declaring "
    "full_width_decode_views)",
    "contiguity on another consumer",
    ("views",),
)
def _build_full_capacity_views(args: BuildArgs) -> Views:
    validated(args)
    write(args, *rows_of(args))
    d, t = args.num_decode_tokens, args.num_tokens
    return Views(
        args.global_decode_buffer[:d], args.decode_lens_buffer[:d], args.prefill_buffer[: t - d]
    )


@builder_mutant(
    "a token's block-table row is its request index minus the first decode token's "
    "(modulo the rows): right only while the batch starts with request 0",
    "batch-dependent width",
    ("independent",),
)
def _build_batch_dependent_values(args: BuildArgs) -> Views:
    validated(args)
    rows = args.token_to_req_indices[: args.num_decode_tokens].to(torch.int64)
    if args.num_decode_tokens and args.block_table.shape[0]:
        rows = (rows - rows[0]) % args.block_table.shape[0]
    return write_and_return(args, rows_of(args, request_rows=rows))


_calls = itertools.count()


@builder_mutant(
    "double-buffers: every other call writes (and returns views of) the rows after "
    "the previous call's, so views move between steps and a captured graph reads "
    "stale rows",
    "packed stride",  # a captured consumer reads rows the step did not write
    ("idempotent",),
)
def _build_ping_pong_rows(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    d, t, width = args.num_decode_tokens, args.num_tokens, args.max_compressed_tokens
    dbuf, lbuf, pbuf = args.global_decode_buffer, args.decode_lens_buffer, args.prefill_buffer
    odd = next(_calls) % 2 == 1
    room = dbuf.shape[0] >= 2 * d and lbuf.shape[0] >= 2 * d and pbuf.shape[0] >= 2 * (t - d)
    shift_d, shift_p = (d, t - d) if odd and room else (0, 0)
    dbuf[shift_d : shift_d + d, :width] = decode
    lbuf[shift_d : shift_d + d] = lens
    pbuf[shift_p : shift_p + t - d, :width] = prefill
    return Views(
        dbuf[shift_d : shift_d + d, :width],
        lbuf[shift_d : shift_d + d],
        pbuf[shift_p : shift_p + t - d, :width],
    )


@builder_mutant(
    "checks none of its arguments: bad widths, dtypes and counts are written or "
    "crash instead of raising a ValueError",
    "unaligned width",
    ("rejects_bad_input",),
)
def _build_no_validation(args: BuildArgs) -> Views:
    return write_and_return(args, rows_of(args))


@builder_mutant(
    "computes n(t) and slot ids with the engine's R = 128 and B = 2 instead of the "
    "compress_ratio and block_size it is given",
    "R and B hard-coded",
    ("other_geometries",),
)
def _build_assumes_engine_geometry(args: BuildArgs) -> Views:
    validated(args)
    engine = args._replace(compress_ratio=COMPRESS_RATIO, block_size=BLOCK_SIZE)
    return write_and_return(args, rows_of(engine))


@builder_mutant(
    "treats only slot -1 as padding (tests slot_mapping == -1, not < 0): a padding "
    "token with slot -2 or int64's minimum gets its real length",
    "padding tokens",
    ("matches_oracle", "padding"),
)
def _build_padding_is_minus_one(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args, zero_padding_lens=False)
    padding = args.slot_mapping[: args.num_decode_tokens] == -1
    return write_and_return(args, (decode, torch.where(padding, 0, lens), prefill))


@builder_mutant(
    "declares padding_rows='inert' but writes a padding token's decode row like a real "
    "token's (real slot ids in columns < n(t)), as vLLM 0.33/0.34 do: the row publishes "
    "physical cache indices",
    "padding rows publish cache indices",
    ("padding", "matches_oracle"),
    padding_rows=INERT,
)
def _build_inert_claim_keeps_slots(args: BuildArgs) -> Views:
    validated(args, INERT)
    return write_and_return(args, rows_of(args))


@builder_mutant(
    "blanks a padding token's decode row to -1 in every column < W (the inert variant) "
    "while declaring the default 'slots' variant, whose row holds real slot ids",
    "padding tokens",
    ("matches_oracle", "adaptive_equals_full"),
)
def _build_blanks_padding_rows(args: BuildArgs) -> Views:
    # Its rows read no table entry for a padding token, so it checks its
    # arguments as the inert variant does: its one fault is the rows.
    validated(args, INERT)
    return write_and_return(args, rows_of(args, inert_padding=True))


@builder_mutant(
    "writes decode rows in one block of 64 and drops the rows past it: wrong only "
    "with more than 64 decode rows (speculative decoding)",
    "more than 64 decode rows",
    ("matches_oracle",),
)
def _build_drops_decode_rows_past_64(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    write(args, decode[:64], lens[:64], prefill)
    return returned_views(args)


@builder_mutant(
    "returns at once, writing nothing, when every token's length is 0 (all "
    "positions < R - 1), as if there were nothing to attend to",
    "all lengths zero",
    ("matches_oracle",),
)
def _build_skips_all_zero_lengths(args: BuildArgs) -> Views:
    validated(args)
    lengths = attended_lengths(args.positions, args.compress_ratio, args.max_compressed_tokens)
    if args.num_tokens and int(lengths.max()) == 0:
        return returned_views(args)
    return write_and_return(args, rows_of(args))



@builder_mutant(
    "writes -1 where the block table holds a negative page, as if it marked an "
    "unallocated page, not the contract's page * B + j % B: only a padding row whose "
    "stale position reaches past its request's pages reads such an entry",
    "padding rows reading the table",
    ("matches_oracle", "adaptive_equals_full"),
)
def _build_negative_pages_as_sentinel(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    negative_page = torch.div(decode, args.block_size, rounding_mode="floor") < 0
    return write_and_return(args, (torch.where(negative_page, SENTINEL, decode), lens, prefill))
