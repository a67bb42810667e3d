"""Builder faults that only engine-scale steps show: a kernel sized for the
usual token budget, narrow request indices, a fixed-size grid."""

from __future__ import annotations

import torch

from ..contract import BuildArgs, Views, returned_views
from ..contract import check_build_arguments as validated
from .builders import rows_of, write, write_and_return
from .registry import builder_mutant

USUAL_TOKENS = 8_192
GRID_ELEMENTS = 1 << 20


@builder_mutant(
    "sized for the engine's usual max_num_batched_tokens: a grid of 8,192 programs, one "
    "a token, so tokens past 8,192 are never written",
    "engine-scale step",
    ("matches_oracle", "padding"),
    # Measured: the CPU budget's draws kill it at example 204, the GPU
    # budget's (which differ) at 402.
    examples=500,
)
def _build_drops_tokens_past_8192(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    d = args.num_decode_tokens
    kept_prefill = max(USUAL_TOKENS - d, 0)
    write(args, decode[:USUAL_TOKENS], lens[:USUAL_TOKENS], prefill[:kept_prefill])
    return returned_views(args)


@builder_mutant(
    "keeps each decode token's request index in 8 bits (a uint8 table row): a step of "
    "more than 256 decode requests reads another request's pages",
    "more than 256 requests",
    ("history_independent",),
)
def _build_request_index_in_8_bits(args: BuildArgs) -> Views:
    validated(args)
    rows = args.token_to_req_indices[: args.num_decode_tokens].to(torch.int64) & 0xFF
    if args.block_table.shape[0]:
        rows = rows.clamp(max=args.block_table.shape[0] - 1)
    return write_and_return(args, rows_of(args, request_rows=rows))


@builder_mutant(
    "launches a fixed grid of 1,048,576 elements a buffer without a grid-stride loop: "
    "elements of a row-major T x W build past the 1,048,576th are never written",
    "engine-scale step",
    ("matches_oracle",),
    examples=200,  # measured: the ci profile's draws beside the covering array over every pair
)
def _build_writes_first_million_elements(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    for buffer, rows in ((args.global_decode_buffer, decode), (args.prefill_buffer, prefill)):
        flat = rows.reshape(-1)[:GRID_ELEMENTS]
        full_rows, rest = divmod(flat.numel(), max(rows.shape[1], 1))
        buffer[:full_rows, : rows.shape[1]] = rows[:full_rows]
        if rest:
            buffer[full_rows, :rest] = rows[full_rows, :rest]
    args.decode_lens_buffer[: args.num_decode_tokens] = lens
    return returned_views(args)
