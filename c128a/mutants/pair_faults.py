"""Builder faults where two dimensions meet: each is right for either value
alone and wrong only in one cell of a pair (:mod:`c128a.strategies.pairs`),
as a kernel that branches on both at once would be. Where the cell is rare
in unsteered draws, the mutant declares the examples its kill may take
(:attr:`~c128a.mutants.registry.Mutant.examples`). The cells of padding x
speculative decode and capacity x width come up in every run's first steps
(a historical step; the first generated ones), so their mutants need no more
examples than any other, and no draw before the pair schedule missed them."""

from __future__ import annotations

import torch

from ..contract import BuildArgs, Views, attended_lengths, returned_views
from ..contract import check_build_arguments as validated
from .builders import rows_of, write, write_and_return
from .registry import builder_mutant

PAIR_EXAMPLES = 100
"""Generated examples a pair mutant's killing properties get (the matrix
gives other mutants 10): a steered step lands in one row of the pair
schedule's dozens."""

ROUNDED_FROM = 1 << 19
STAGED_COLUMNS = 16
ROW_BLOCK = 64
PAD_CHUNK = 1024


@builder_mutant(
    "takes a step of one token for a decode step (the engine's usual one-token step): "
    "a lone prefill token's row goes to the decode buffer, the prefill buffer's stays "
    "unwritten",
    "tokens x decode/prefill mix",
    ("matches_oracle",),
    examples=PAIR_EXAMPLES,
)
def _build_lone_prefill_token_as_decode(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    if args.num_tokens == 1 and args.num_decode_tokens == 0:
        args.global_decode_buffer[:1, : prefill.shape[1]] = prefill
        return returned_views(args)
    return write_and_return(args, (decode, lens, prefill))


@builder_mutant(
    "past 524,288, divides p + 1 by an R that is not a power of two rounding to the "
    "nearest entry (a power of two takes a shift, and every smaller p the exact path): "
    "one entry too many for about half the tokens there",
    "compress ratio x position magnitude",
    ("matches_oracle",),
    examples=100,  # measured: the ci profile's draws beside the covering array over every pair
)
def _build_ratio_rounded_past_2_19(args: BuildArgs) -> Views:
    validated(args)
    lengths = args.positions.to(torch.int64) + 1
    ratio = args.compress_ratio
    exact = lengths // ratio
    if ratio & (ratio - 1):
        nearest = (2 * lengths + ratio) // (2 * ratio)
        exact = torch.where(lengths >= ROUNDED_FROM, nearest, exact)
    return write_and_return(args, rows_of(args, lengths=exact.clamp(max=args.max_compressed_tokens)))


@builder_mutant(
    "reads the block table of a step with one request through a 16-column scratch "
    "(right for a short context): a lone request of 17 to 256 pages reads page 0 past "
    "column 16",
    "requests x block-table width",
    ("matches_oracle",),
    # Measured: the CPU budget's draws kill it at example 223, the GPU
    # budget's (which differ) at 1,247.
    examples=1_300,
)
def _build_lone_request_table_in_16_columns(args: BuildArgs) -> Views:
    validated(args)
    table = args.block_table
    lone = table.shape[0] == 1 and args.num_decode_tokens == args.num_tokens
    if lone and STAGED_COLUMNS < table.shape[1] <= 256:
        table = table.clone()
        table[:, STAGED_COLUMNS:] = 0
    return write_and_return(args, rows_of(args, table=table))


@builder_mutant(
    "clamps n(t) to the columns between two rows rather than to W when the rows are "
    "further apart than C: a list longer than W runs on past W",
    "buffer layout x width against need",
    ("untouched_memory",),
    examples=50,  # measured: the ci profile's draws beside the covering array over every pair
)
def _build_clamp_to_row_stride(args: BuildArgs) -> Views:
    validated(args)
    buffer = args.global_decode_buffer
    if buffer.stride(0) <= buffer.shape[1]:
        return write_and_return(args, rows_of(args))
    columns = min(buffer.shape[1], args.prefill_buffer.shape[1])
    lengths = attended_lengths(args.positions, args.compress_ratio, columns)
    write(args, *rows_of(args, lengths=lengths, columns=columns))
    return returned_views(args)


@builder_mutant(
    "starts a long prefill (more than 64 tokens) at the next 64-row block after the "
    "decode rows: beside 1 to 63 decode rows, the first prefill rows are left unwritten",
    "decode rows x prefill tokens",
    ("matches_oracle",),
    examples=PAIR_EXAMPLES,
)
def _build_long_prefill_from_the_next_row_block(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    d, p = args.num_decode_tokens, args.num_tokens - args.num_decode_tokens
    skipped = ROW_BLOCK - d
    if p > ROW_BLOCK and 0 < d < ROW_BLOCK:
        write(args, decode, lens, prefill[:0])
        args.prefill_buffer[skipped:p, : prefill.shape[1]] = prefill[skipped:]
        return returned_views(args)
    return write_and_return(args, (decode, lens, prefill))


@builder_mutant(
    "with B = 1, a step whose decode lists hold one entry at most takes a fast path "
    "whose slot is one past the page's (an off-by-one no longer list and no larger "
    "block reaches)",
    "block size x longest list",
    ("matches_oracle",),
    examples=PAIR_EXAMPLES,
)
def _build_one_entry_lists_one_slot_past(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    d = args.num_decode_tokens
    table = args.block_table
    if args.block_size == 1 and d and table.shape[1] and int(decode.shape[1]):
        lengths = attended_lengths(args.positions[:d], args.compress_ratio, args.width)
        if int(lengths.max()) == 1:
            rows = args.token_to_req_indices[:d].to(torch.int64)
            pages = table.index_select(0, rows)[:, 0].to(torch.int32) + 1
            decode = decode.clone()
            decode[:, 0] = torch.where(decode[:, 0] >= 0, pages, decode[:, 0])
    return write_and_return(args, (decode, lens, prefill))


@builder_mutant(
    "zeroes the lengths of every decode token of a request that holds a padding token, "
    "once the request has several real tokens (a padding rule kept per request): a "
    "speculative request's real tokens beside its padding attend to nothing",
    "padding x speculative decode",
    ("matches_oracle",),
)
def _build_padding_zeroes_its_whole_request(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    d = args.num_decode_tokens
    if d:
        requests = args.token_to_req_indices[:d].to(torch.int64)
        padded = args.slot_mapping[:d] < 0
        size = int(requests.max()) + 1
        real_tokens = torch.bincount(requests[~padded], minlength=size)
        holds_padding = torch.bincount(requests[padded], minlength=size) > 0
        zeroed = (holds_padding & (real_tokens > 1))[requests]
        lens = torch.where(zeroed, torch.zeros_like(lens), lens)
    return write_and_return(args, (decode, lens, prefill))


@builder_mutant(
    "pads a row with -1 in 1,024-column chunks and, in its variant for a capacity that "
    "is not a power of two, counts W's chunks rounding down (the other variant rounds "
    "up): past the last whole chunk, columns from n(t) to W keep what was there",
    "capacity x width",
    ("matches_oracle",),
)
def _build_pads_whole_chunks_of_an_uneven_capacity(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    capacity, width = args.global_decode_buffer.shape[1], args.max_compressed_tokens
    if capacity & (capacity - 1) and width >= PAD_CHUNK and width % PAD_CHUNK:
        padded_to = width // PAD_CHUNK * PAD_CHUNK
        decode, prefill = decode.clone(), prefill.clone()
        for rows, buffer in ((decode, args.global_decode_buffer), (prefill, args.prefill_buffer)):
            tail, kept = rows[:, padded_to:], buffer[: rows.shape[0], padded_to:width]
            rows[:, padded_to:] = torch.where(tail < 0, kept, tail)
    return write_and_return(args, (decode, lens, prefill))


ENGINE_RATIO = 128


@builder_mutant(
    "stores a lone token's row at the engine's R = 128 through a one-token path that "
    "writes its n(t) entries only (right at any other R, and for more tokens at R = 128): "
    "columns n(t) to W keep what the buffer held",
    "tokens x compress ratio (a pair none of the first eight declared)",
    ("matches_oracle",),
    examples=PAIR_EXAMPLES,
)
def _build_lone_token_at_the_engine_ratio_skips_the_tail(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    if args.num_tokens != 1 or args.compress_ratio != ENGINE_RATIO:
        return write_and_return(args, (decode, lens, prefill))
    buffer = args.global_decode_buffer if args.num_decode_tokens else args.prefill_buffer
    width = args.max_compressed_tokens
    entries = int(attended_lengths(args.positions, args.compress_ratio, width)[0])
    kept = buffer[0, entries:width].clone()
    write(args, decode, lens, prefill)
    buffer[0, entries:width] = kept
    return returned_views(args)
