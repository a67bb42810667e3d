"""The adaptive-width Triton kernel.

One launch writes every token's list at the active width W into buffers
whose row stride stays at the capacity C. The grid tiles (tokens x columns):
each program owns BLOCK_T tokens and BLOCK_W columns, so work scales with
T * W and no lane runs past W. Every scalar that varies from step to step
(width, token counts, strides) is excluded from Triton's specialisation key,
so a warmed-up kernel never recompiles mid-inference; the tile sizes are the
only compile-time constants and do not depend on the batch.

Import this module only after choosing the device: on the CPU, Triton's
interpreter must be switched on (``TRITON_INTERPRET=1``) before the kernel is
decorated. :func:`c128a.device.use_device` does that.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import returned_views
from .validation import InvalidArgument, check_build_arguments

RUNTIME_SCALARS = (
    "num_tokens",
    "num_decode_tokens",
    "width",
    "compress_ratio",
    "block_size",
    "table_row_stride",
    "decode_row_stride",
    "prefill_row_stride",
)


@triton.jit(do_not_specialize=RUNTIME_SCALARS)
def c128a_topk_kernel(
    positions_ptr,
    token_to_req_ptr,
    block_table_ptr,
    slot_mapping_ptr,
    decode_ptr,
    decode_lens_ptr,
    prefill_ptr,
    num_tokens,
    num_decode_tokens,
    width,
    compress_ratio,
    block_size,
    table_row_stride,
    decode_row_stride,
    prefill_row_stride,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    columns = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    is_token = tokens < num_tokens
    is_decode = is_token & (tokens < num_decode_tokens)
    is_prefill = is_token & (tokens >= num_decode_tokens)
    in_width = columns < width

    positions = tl.load(positions_ptr + tokens, mask=is_token, other=0)
    lengths = tl.minimum((positions + 1) // compress_ratio, width)
    active = columns[None, :] < lengths[:, None]

    # Decode rows: slot ids through the request's block-table row, read only
    # where the column is active.
    requests = tl.load(token_to_req_ptr + tokens, mask=is_decode, other=0).to(tl.int64)
    pages = tl.load(
        block_table_ptr + requests[:, None] * table_row_stride + (columns // block_size)[None, :],
        mask=is_decode[:, None] & active,
        other=0,
    )
    slots = pages * block_size + (columns % block_size)[None, :]
    tl.store(
        decode_ptr + tokens.to(tl.int64)[:, None] * decode_row_stride + columns[None, :],
        tl.where(active, slots, -1),
        mask=is_decode[:, None] & in_width[None, :],
    )

    # Prefill rows: local indices 0..n(t)-1.
    prefill_rows = (tokens - num_decode_tokens).to(tl.int64)
    tl.store(
        prefill_ptr + prefill_rows[:, None] * prefill_row_stride + columns[None, :],
        tl.where(active, columns[None, :], -1),
        mask=is_prefill[:, None] & in_width[None, :],
    )

    if tl.program_id(1) == 0:
        slot_ids = tl.load(slot_mapping_ptr + tokens, mask=is_decode, other=0)
        lens = tl.where(slot_ids < 0, 0, lengths)
        tl.store(decode_lens_ptr + tokens, lens.to(tl.int32), mask=is_decode)


def _interpreting() -> bool:
    return type(c128a_topk_kernel).__name__ == "InterpretedFunction"


# The interpreter pays per program, not per element: bigger tiles there.
TILE = (32, 1024) if _interpreting() else (8, 128)


def launch(
    positions,
    compress_ratio,
    num_decode_tokens,
    token_to_req_indices,
    block_table,
    block_size,
    slot_mapping,
    global_decode_buffer,
    decode_lens_buffer,
    prefill_buffer,
    width,
) -> None:
    """Launch without validation (benchmarks); callers guarantee the contract."""
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        return
    block_t, block_w = TILE
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(width, block_w))
    c128a_topk_kernel[grid](
        positions,
        token_to_req_indices,
        block_table,
        slot_mapping,
        global_decode_buffer,
        decode_lens_buffer,
        prefill_buffer,
        num_tokens,
        num_decode_tokens,
        width,
        compress_ratio,
        block_size,
        block_table.stride(0),
        global_decode_buffer.stride(0),
        prefill_buffer.stride(0),
        BLOCK_T=block_t,
        BLOCK_W=block_w,
    )


def build_c128a_topk_metadata(
    positions: torch.Tensor,
    compress_ratio: int,
    num_decode_tokens: int,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    slot_mapping: torch.Tensor,
    global_decode_buffer: torch.Tensor,
    decode_lens_buffer: torch.Tensor,
    prefill_buffer: torch.Tensor,
    max_compressed_tokens: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_build_arguments(
        positions,
        compress_ratio,
        num_decode_tokens,
        token_to_req_indices,
        block_table,
        block_size,
        slot_mapping,
        global_decode_buffer,
        decode_lens_buffer,
        prefill_buffer,
        max_compressed_tokens,
    )
    if positions.device.type == "cpu" and not _interpreting():
        raise InvalidArgument(
            "positions is on the CPU but Triton's interpreter is off; set TRITON_INTERPRET=1 "
            "before importing c128a.kernel (c128a.device.use_device('cpu') does this)"
        )
    launch(
        positions,
        compress_ratio,
        num_decode_tokens,
        token_to_req_indices,
        block_table,
        block_size,
        slot_mapping,
        global_decode_buffer,
        decode_lens_buffer,
        prefill_buffer,
        max_compressed_tokens,
    )
    return returned_views(
        global_decode_buffer,
        decode_lens_buffer,
        prefill_buffer,
        positions.shape[0],
        num_decode_tokens,
        max_compressed_tokens,
    )
