"""The reference oracle: the contract written as whole-tensor torch code.

Deliberately plain. Every other implementation is compared against this one
with ``torch.equal``. It writes exactly what the contract says the kernel
writes (rows < T, columns < W) and returns views of the persistent buffers.
"""

from __future__ import annotations

import torch

from .validation import check_build_arguments


def attended_lengths(positions: torch.Tensor, compress_ratio: int, width: int) -> torch.Tensor:
    """n(t) = min(floor((p + 1) / R), W) for every token, as int64."""
    return torch.clamp((positions.to(torch.int64) + 1) // compress_ratio, max=width)


def returned_views(
    global_decode_buffer: torch.Tensor,
    decode_lens_buffer: torch.Tensor,
    prefill_buffer: torch.Tensor,
    num_tokens: int,
    num_decode_tokens: int,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three views the contract returns: buffer slices, row stride kept."""
    return (
        global_decode_buffer[:num_decode_tokens, :width],
        decode_lens_buffer[:num_decode_tokens],
        prefill_buffer[: num_tokens - num_decode_tokens, :width],
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
    arguments = (
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
    check_build_arguments(*arguments)
    return write_metadata(*arguments)


def write_metadata(
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
    """:func:`build_c128a_topk_metadata` without the argument checks, for
    arguments already known to be inside the contract (the harness's
    expected values: checking them again costs a device synchronisation on
    every example)."""
    width = max_compressed_tokens
    num_tokens = positions.shape[0]
    num_decode = num_decode_tokens
    device = positions.device

    lengths = attended_lengths(positions, compress_ratio, width)
    columns = torch.arange(width, device=device, dtype=torch.int64)
    active = columns.unsqueeze(0) < lengths.unsqueeze(1)
    sentinel = -1  # a Python scalar: a tensor would cost a host-to-device copy

    if num_decode:
        requests = token_to_req_indices[:num_decode].to(torch.int64)
        table_width = block_table.shape[1]
        if table_width:
            # Inactive columns are masked below; clamping only keeps the gather in range.
            pages = block_table.index_select(0, requests).to(torch.int64)
            page_columns = (columns // block_size).clamp(max=table_width - 1)
            pages = pages.gather(1, page_columns.expand(num_decode, width))
        else:
            pages = torch.zeros(num_decode, width, device=device, dtype=torch.int64)
        slots = pages * block_size + columns % block_size
        global_decode_buffer[:num_decode, :width] = torch.where(
            active[:num_decode], slots, sentinel
        ).to(torch.int32)
        padding = slot_mapping[:num_decode] < 0
        decode_lens_buffer[:num_decode] = torch.where(
            padding, torch.zeros_like(lengths[:num_decode]), lengths[:num_decode]
        ).to(torch.int32)

    if num_tokens > num_decode:
        prefill_buffer[: num_tokens - num_decode, :width] = torch.where(
            active[num_decode:], columns, sentinel
        ).to(torch.int32)

    return returned_views(
        global_decode_buffer, decode_lens_buffer, prefill_buffer, num_tokens, num_decode, width
    )
