"""Builder faults in the division by R or B: right at the engine's R = 128
and B = 2, and at every power of two."""

from __future__ import annotations

import torch

from ..contract import BuildArgs, Views
from ..contract import check_build_arguments as validated
from .builders import rows_of, write_and_return
from .registry import builder_mutant

TILE = 128


def _slot_ids(args: BuildArgs, pages: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Each decode row's slot ids at the page columns ``pages`` (clamped into
    the table) plus ``offsets``: block_table[r, page] * B + offset, int32."""
    d = args.num_decode_tokens
    rows = args.token_to_req_indices[:d].to(torch.int64)
    table = args.block_table.index_select(0, rows).to(torch.int64)
    pages = pages.clamp(max=args.block_table.shape[1] - 1)
    return (table.gather(1, pages.expand(d, -1)) * args.block_size + offsets).to(torch.int32)


def _float32_quotient(values: torch.Tensor, divisor: int) -> torch.Tensor:
    """values // divisor through a float32 reciprocal, truncated: a kernel's
    shortcut for an integer division, exact for a power of two."""
    reciprocal = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(float(divisor))
    return (values.to(torch.float32) * reciprocal.to(values.device)).to(torch.int64)


@builder_mutant(
    "n(t) = (p + 1) times the float32 reciprocal of R, truncated, instead of an integer "
    "division: one entry short for some multiples of an R such as 41 or 1,000,001",
    "R and B hard-coded",
    ("adaptive_equals_full", "other_geometries"),
    examples=200,  # the ci profile's draws since inputs are drawn as an engine hands them
)
def _build_ratio_through_float_reciprocal(args: BuildArgs) -> Views:
    validated(args)
    positions = args.positions.to(torch.int64) + 1
    lengths = _float32_quotient(positions, args.compress_ratio).clamp(
        min=0, max=args.max_compressed_tokens)
    return write_and_return(args, rows_of(args, lengths=lengths))


@builder_mutant(
    "a column's page j // B through the float32 reciprocal of B, truncated: the page "
    "before the right one for some columns of a B such as 41",
    "R and B hard-coded",
    ("history_independent",),
)
def _build_block_through_float_reciprocal(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    if args.num_decode_tokens and args.block_table.shape[1]:
        columns = torch.arange(args.max_compressed_tokens, device=decode.device)
        pages = _float32_quotient(columns, args.block_size)
        # j - page * B as the offset: one page short makes it B too large.
        slots = _slot_ids(args, pages, columns - pages * args.block_size)
        decode = torch.where(decode >= 0, slots, decode)
    return write_and_return(args, (decode, lens, prefill))


@builder_mutant(
    "finds a column's page within its 128-column tile, as if a page never spanned tiles "
    "(B <= 128): a block size above 128 reads the wrong page for columns past 128",
    "R and B hard-coded",
    ("matches_oracle", "adaptive_equals_full"),
    examples=300,  # measured: the ci profile's draws beside the covering array over every pair
)
def _build_block_size_capped_at_tile(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    if args.block_size > TILE and args.num_decode_tokens and args.block_table.shape[1]:
        # Page j // 128 where the contract says j // B; slot ids page * B + j % 128.
        columns = torch.arange(args.max_compressed_tokens, device=decode.device)
        decode = torch.where(decode >= 0, _slot_ids(args, columns // TILE, columns % TILE),
                             decode)
    return write_and_return(args, (decode, lens, prefill))
