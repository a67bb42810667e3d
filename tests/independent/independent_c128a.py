"""A plain, row-by-row implementation of the C128A top-k metadata contract.

It is a target in its own right: ``build_c128a_topk_metadata``,
``active_topk_width`` and ``capacity_width`` follow
the C128A contract (CONTRACT.md). The work is split into small methods of
``RowBuilder`` so that each step of the contract has one obvious home.
"""

from __future__ import annotations

import torch

TILE = 128  # top-k widths must be multiples of the decode kernel's tile


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(x: int) -> int:
    power = 1
    while power < x:
        power *= 2
    return power


# ---------------------------------------------------------------------------
# Width policy
# ---------------------------------------------------------------------------


def capacity_width(max_model_len: int, compress_ratio: int) -> int:
    """Persistent buffer width C = ceil(ceil(max_model_len / R) / 128) * 128."""
    if max_model_len <= 0:
        raise ValueError(f"max_model_len must be positive, got {max_model_len}")
    if compress_ratio <= 0:
        raise ValueError(f"compress_ratio must be positive, got {compress_ratio}")
    compressed = _ceil_div(max_model_len, compress_ratio)
    return _ceil_div(compressed, TILE) * TILE


def active_topk_width(max_seq_len: int, compress_ratio: int, capacity: int) -> int:
    """Per-step width W = min(max(next_pow2(max(max_seq_len // R, 1)), 128), C)."""
    if compress_ratio <= 0:
        raise ValueError(f"compress_ratio must be positive, got {compress_ratio}")
    if capacity <= 0 or capacity % TILE != 0:
        raise ValueError(
            f"capacity must be a positive multiple of {TILE}, got {capacity}"
        )
    if max_seq_len < 0:
        raise ValueError(f"max_seq_len must be non-negative, got {max_seq_len}")
    needed = max_seq_len // compress_ratio
    if needed > capacity:
        raise ValueError(
            f"capacity {capacity} cannot cover max_seq_len // compress_ratio = "
            f"{max_seq_len} // {compress_ratio} = {needed}"
        )
    return min(max(_next_power_of_2(max(needed, 1)), TILE), capacity)


# ---------------------------------------------------------------------------
# Kernel-level function
# ---------------------------------------------------------------------------


class RowBuilder:
    """Fills the metadata buffers one token row at a time."""

    def visible_count(self, position: int, compress_ratio: int, width: int) -> int:
        # n(t) = min(floor((p + 1) / R), W); a stale negative position sees nothing.
        return max(0, min((position + 1) // compress_ratio, width))

    def table_row(
        self, block_table: torch.Tensor, request: int, token: int
    ) -> torch.Tensor:
        return block_table[request]

    def decode_slots(
        self, table_row: torch.Tensor, count: int, block_size: int
    ) -> torch.Tensor:
        """Slot ids of the first ``count`` compressed entries of one request."""
        blocks_needed = _ceil_div(count, block_size)
        if blocks_needed > table_row.shape[0]:
            raise ValueError(
                f"block_table has {table_row.shape[0]} columns but a decode token "
                f"needs {blocks_needed} blocks of block_size {block_size}"
            )
        blocks = table_row[:blocks_needed].to(torch.int64)  # only j < n is read
        offsets = torch.arange(block_size, dtype=torch.int64, device=blocks.device)
        slots = blocks[:, None] * block_size + offsets[None, :]
        return slots.reshape(-1)[:count]

    def decode_row(
        self,
        table_row: torch.Tensor,
        count: int,
        block_size: int,
        width: int,
        padding: bool,
        device: torch.device,
    ) -> torch.Tensor:
        row = torch.full((width,), -1, dtype=torch.int64, device=device)
        if count > 0:
            row[:count] = self.decode_slots(table_row, count, block_size)
        return row

    def decode_len(
        self, position: int, compress_ratio: int, width: int, slot: int
    ) -> int:
        if slot < 0:
            return 0
        return self.visible_count(position, compress_ratio, width)

    def prefill_row(self, count: int, width: int, device: torch.device) -> torch.Tensor:
        columns = torch.arange(width, dtype=torch.int64, device=device)
        return torch.where(columns < count, columns, torch.full_like(columns, -1))

    def write_width(self, width: int, buffer: torch.Tensor) -> int:
        return width

    def prefill_row_index(self, token: int, num_decode_tokens: int) -> int:
        return token - num_decode_tokens

    def views(
        self,
        global_decode_buffer: torch.Tensor,
        decode_lens_buffer: torch.Tensor,
        prefill_buffer: torch.Tensor,
        num_decode_tokens: int,
        num_prefill_tokens: int,
        width: int,
    ):
        return (
            global_decode_buffer[:num_decode_tokens, :width],
            decode_lens_buffer[:num_decode_tokens],
            prefill_buffer[:num_prefill_tokens, :width],
        )

    def place_decode_row(self, buffer: torch.Tensor, row_index: int, values, width):
        buffer[row_index, : values.shape[0]] = values.to(buffer.dtype)

    def place_prefill_row(self, buffer: torch.Tensor, row_index: int, values, width):
        buffer[row_index, : values.shape[0]] = values.to(buffer.dtype)

    # -- driver ------------------------------------------------------------

    def check(
        self,
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
        if width % TILE != 0:
            raise ValueError(
                f"max_compressed_tokens must be a multiple of {TILE}, got {width}"
            )
        if width <= 0:
            raise ValueError(f"max_compressed_tokens must be positive, got {width}")
        for name, buffer in (
            ("global_decode_buffer", global_decode_buffer),
            ("prefill_buffer", prefill_buffer),
        ):
            if buffer.dim() != 2:
                raise ValueError(f"{name} must be 2-D, got shape {tuple(buffer.shape)}")
            if width > buffer.shape[1]:
                raise ValueError(
                    f"max_compressed_tokens {width} exceeds {name} width "
                    f"{buffer.shape[1]}"
                )
            if buffer.stride(-1) != 1:
                raise ValueError(
                    f"{name} must have last-dimension stride 1, got {buffer.stride(-1)}"
                )
        if compress_ratio <= 0:
            raise ValueError(f"compress_ratio must be positive, got {compress_ratio}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        num_tokens = positions.shape[0]
        if not 0 <= num_decode_tokens <= num_tokens:
            raise ValueError(
                f"num_decode_tokens must lie in [0, {num_tokens}], got {num_decode_tokens}"
            )
        if token_to_req_indices.shape[0] < num_decode_tokens:
            raise ValueError(
                f"token_to_req_indices has {token_to_req_indices.shape[0]} entries, "
                f"fewer than num_decode_tokens {num_decode_tokens}"
            )
        if slot_mapping.shape[0] < num_tokens:
            raise ValueError(
                f"slot_mapping has {slot_mapping.shape[0]} entries, fewer than the "
                f"{num_tokens} tokens"
            )
        if global_decode_buffer.shape[0] < num_decode_tokens:
            raise ValueError("global_decode_buffer has fewer rows than decode tokens")
        if decode_lens_buffer.shape[0] < num_decode_tokens:
            raise ValueError("decode_lens_buffer has fewer rows than decode tokens")
        if prefill_buffer.shape[0] < num_tokens - num_decode_tokens:
            raise ValueError("prefill_buffer has fewer rows than prefill tokens")

    def build(
        self,
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
        max_compressed_tokens=8192,
    ):
        width = int(max_compressed_tokens)
        num_decode_tokens = int(num_decode_tokens)
        self.check(
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
        )
        num_tokens = positions.shape[0]
        position_list = positions.tolist()
        request_list = token_to_req_indices[:num_decode_tokens].tolist()
        slot_list = slot_mapping[:num_tokens].tolist()
        device = global_decode_buffer.device

        for token in range(num_decode_tokens):
            request = request_list[token]
            if not 0 <= request < block_table.shape[0]:
                raise ValueError(
                    f"token_to_req_indices[{token}] = {request} is outside the "
                    f"{block_table.shape[0]} block_table rows"
                )
            count = self.visible_count(position_list[token], compress_ratio, width)
            padding = slot_list[token] < 0
            row = self.decode_row(
                self.table_row(block_table, request, token),
                count,
                block_size,
                self.write_width(width, global_decode_buffer),
                padding,
                device,
            )
            self.place_decode_row(global_decode_buffer, token, row, width)
            decode_lens_buffer[token] = self.decode_len(
                position_list[token], compress_ratio, width, slot_list[token]
            )

        for token in range(num_decode_tokens, num_tokens):
            count = self.visible_count(position_list[token], compress_ratio, width)
            row = self.prefill_row(
                count, self.write_width(width, prefill_buffer), prefill_buffer.device
            )
            self.place_prefill_row(
                prefill_buffer,
                self.prefill_row_index(token, num_decode_tokens),
                row,
                width,
            )

        return self.views(
            global_decode_buffer,
            decode_lens_buffer,
            prefill_buffer,
            num_decode_tokens,
            num_tokens - num_decode_tokens,
            width,
        )


_BUILDER = RowBuilder()


def build_c128a_topk_metadata(
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
    max_compressed_tokens=8192,
):
    """Write the C128A top-k metadata into the buffers and return their views."""
    return _BUILDER.build(
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
