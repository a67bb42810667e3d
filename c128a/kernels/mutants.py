"""Triton-kernel mutants: kernels that compute the right values but break a
promise only the compiled kernel can break.

``width_specialised`` passes the active width as a ``tl.constexpr``, so Triton
compiles one variant per width: its values are exact (every value test
passes, on the CPU and on the GPU), and only counting compiled variants after
a warm-up at the largest width catches it (``tests/test_recompile.py``). This
is the bug that hung one tensor-parallel rank in a compile at >524K context.

``reads_one_entry_past`` reads each decode row's block table one page past
n(t) (a load mask of ``j < n(t) + B``; the store still masks by n(t)): its
values are exact too, and only the GPU's ``compute-sanitizer`` sees the read
(``initcheck`` of an entry nothing wrote, ``memcheck`` past the table's
allocation; ``c128a sanitize``).

Load it as a target with ``c128a.kernels.mutants:width_specialised``. Import
this module only after choosing the device (:func:`c128a.targets.use_device`).
"""

from __future__ import annotations

from types import SimpleNamespace

import triton
import triton.language as tl

from ..contract import BuildArgs
from .builder import row_strides, tensor_arguments, triton_builder

TILE = (32, 128)  # tokens x columns per program


@triton.jit
def _write_decode_rows(
    tokens,
    columns,
    lengths,
    is_decode,
    in_width,
    token_to_req_ptr,
    block_table_ptr,
    decode_ptr,
    block_size,
    table_row_stride,
    decode_row_stride,
    read_past,
):
    # Slot ids through the request's block-table row, read where the column
    # is active (``read_past``: up to one page further). Page and offset are
    # per column, not per element.
    active = columns[None, :] < lengths[:, None]
    read = columns[None, :] < (lengths + read_past * block_size)[:, None]
    requests = tl.load(token_to_req_ptr + tokens, mask=is_decode, other=0).to(tl.int64)
    page_columns = columns // block_size
    page_offsets = columns - page_columns * block_size
    pages = tl.load(
        block_table_ptr + requests[:, None] * table_row_stride + page_columns[None, :],
        mask=is_decode[:, None] & read,
        other=0,
    )
    slots = pages * block_size + page_offsets[None, :]
    tl.store(
        decode_ptr + tokens.to(tl.int64)[:, None] * decode_row_stride + columns[None, :],
        tl.where(active, slots, -1),
        mask=is_decode[:, None] & in_width[None, :],
    )


@triton.jit
def _write_prefill_rows(
    rows,
    columns,
    lengths,
    is_prefill,
    in_width,
    prefill_ptr,
    prefill_row_stride,
):
    # Local indices 0..n(t)-1, then the -1 sentinel.
    tl.store(
        prefill_ptr + rows.to(tl.int64)[:, None] * prefill_row_stride + columns[None, :],
        tl.where(columns[None, :] < lengths[:, None], columns[None, :], -1),
        mask=is_prefill[:, None] & in_width[None, :],
    )


@triton.jit
def _write_rows(
    positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
    decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, width, compress_ratio,
    block_size, table_row_stride, decode_row_stride, prefill_row_stride, read_past,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
):
    first_token = tl.program_id(0) * BLOCK_T
    tokens = first_token + tl.arange(0, BLOCK_T)
    columns = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    is_token = tokens < num_tokens
    in_width = columns < width
    positions = tl.load(positions_ptr + tokens, mask=is_token, other=0)
    lengths = tl.minimum((positions + 1) // compress_ratio, width).to(tl.int32)
    is_decode = is_token & (tokens < num_decode_tokens)
    if first_token < num_decode_tokens:
        _write_decode_rows(
            tokens, columns, lengths, is_decode, in_width, token_to_req_ptr, block_table_ptr,
            decode_ptr, block_size, table_row_stride, decode_row_stride, read_past,
        )
        if tl.program_id(1) == 0:
            slot_ids = tl.load(slot_mapping_ptr + tokens, mask=is_decode, other=0)
            tl.store(decode_lens_ptr + tokens, tl.where(slot_ids < 0, 0, lengths), mask=is_decode)
    if first_token + BLOCK_T > num_decode_tokens:
        _write_prefill_rows(
            tokens - num_decode_tokens, columns, lengths, is_token & (tokens >= num_decode_tokens),
            in_width, prefill_ptr, prefill_row_stride,
        )


# Every runtime scalar but the width stays out of the key, as in the project's
# kernel: the width alone must be what recompiles.
_UNSPECIALISED = (
    "num_tokens",
    "num_decode_tokens",
    "compress_ratio",
    "block_size",
    "table_row_stride",
    "decode_row_stride",
    "prefill_row_stride",
)


@triton.jit(do_not_specialize=_UNSPECIALISED)
def width_specialised_kernel(
    positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
    decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, compress_ratio, block_size,
    table_row_stride, decode_row_stride, prefill_row_stride,
    WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
):
    _write_rows(
        positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
        decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, WIDTH, compress_ratio,
        block_size, table_row_stride, decode_row_stride, prefill_row_stride, 0, BLOCK_T, BLOCK_W,
    )


@triton.jit(do_not_specialize=(*_UNSPECIALISED, "width"))
def reads_one_entry_past_kernel(
    positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
    decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, width, compress_ratio,
    block_size, table_row_stride, decode_row_stride, prefill_row_stride,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
):
    _write_rows(
        positions_ptr, token_to_req_ptr, block_table_ptr, slot_mapping_ptr, decode_ptr,
        decode_lens_ptr, prefill_ptr, num_tokens, num_decode_tokens, width, compress_ratio,
        block_size, table_row_stride, decode_row_stride, prefill_row_stride, 1, BLOCK_T, BLOCK_W,
    )


def _grid(args: BuildArgs) -> tuple[int, int]:
    block_t, block_w = TILE
    return (triton.cdiv(args.num_tokens, block_t), triton.cdiv(args.max_compressed_tokens, block_w))


def _launch_width_specialised(args: BuildArgs) -> None:
    if args.num_tokens == 0:
        return
    width_specialised_kernel[_grid(args)](
        *tensor_arguments(args), args.num_tokens, args.num_decode_tokens, args.compress_ratio,
        args.block_size, *row_strides(args),
        WIDTH=args.max_compressed_tokens, BLOCK_T=TILE[0], BLOCK_W=TILE[1],
    )


def _launch_reads_one_entry_past(args: BuildArgs) -> None:
    if args.num_tokens == 0:
        return
    reads_one_entry_past_kernel[_grid(args)](
        *tensor_arguments(args), args.num_tokens, args.num_decode_tokens,
        args.max_compressed_tokens, args.compress_ratio, args.block_size, *row_strides(args),
        BLOCK_T=TILE[0], BLOCK_W=TILE[1],
    )


width_specialised = SimpleNamespace(
    build_c128a_topk_metadata=triton_builder(_launch_width_specialised, "width_specialised"),
    launch=_launch_width_specialised,
    jit_functions=(width_specialised_kernel,),
)
"""Target namespace: exact values, one compiled variant per width."""

reads_one_entry_past = SimpleNamespace(
    build_c128a_topk_metadata=triton_builder(_launch_reads_one_entry_past, "reads_one_entry_past"),
    launch=_launch_reads_one_entry_past,
    jit_functions=(reads_one_entry_past_kernel,),
)
"""Target namespace: exact values; reads one block-table page past n(t),
which only the GPU's sanitizer sees (``c128a sanitize``)."""
