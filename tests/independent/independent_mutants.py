"""Deliberately broken variants of ``independent_c128a``, one fault each.

Each entry of ``MUTANTS`` is a target exposing ``build_c128a_topk_metadata``,
``active_topk_width`` and ``capacity_width``; exactly one of them differs from
the contract. ``DESCRIPTIONS`` says what the fault is and which valid input
exposes it. A suite that tests the contract should reject every one.
"""

from __future__ import annotations

import os
import sys
import types

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import independent_c128a as correct  # noqa: E402
from independent_c128a import TILE, RowBuilder, _ceil_div, _next_power_of_2  # noqa: E402


# ---------------------------------------------------------------------------
# Kernel-level faults
# ---------------------------------------------------------------------------


class PackedStride(RowBuilder):
    """Rows laid out at stride W inside the buffers' storage (the reverted bug)."""

    @staticmethod
    def _packed(buffer: torch.Tensor, rows: int, width: int) -> torch.Tensor:
        return buffer.as_strided((rows, width), (width, 1), buffer.storage_offset())

    def place_decode_row(self, buffer, row_index, values, width):
        packed = self._packed(buffer, row_index + 1, width)
        packed[row_index] = values.to(buffer.dtype)

    def place_prefill_row(self, buffer, row_index, values, width):
        packed = self._packed(buffer, row_index + 1, width)
        packed[row_index] = values.to(buffer.dtype)

    def views(self, gdb, dlb, pb, num_decode, num_prefill, width):
        return (
            self._packed(gdb, num_decode, width),
            dlb[:num_decode],
            self._packed(pb, num_prefill, width),
        )


class CeilCount(RowBuilder):
    """n rounded up: ceil((p + 1) / R) instead of floor."""

    def visible_count(self, position, compress_ratio, width):
        return max(0, min(_ceil_div(position + 1, compress_ratio), width))


class CountFromPosition(RowBuilder):
    """n = floor((p + 2) / R): the count of a position one step ahead."""

    def visible_count(self, position, compress_ratio, width):
        return max(0, min((position + 2) // compress_ratio, width))


class PaddingLensKept(RowBuilder):
    """decode_lens keeps n for padding tokens (slot_mapping < 0)."""

    def decode_len(self, position, compress_ratio, width, slot):
        return self.visible_count(position, compress_ratio, width)


class PaddingRowBlanked(RowBuilder):
    """Padding decode tokens get an all -1 row instead of their real slot ids."""

    def decode_row(self, table_row, count, block_size, width, padding, device):
        if padding:
            count = 0
        return super().decode_row(table_row, count, block_size, width, padding, device)


class LensUnclamped(RowBuilder):
    """decode_lens is floor((p + 1) / R) without the min with W; rows are clamped."""

    def decode_len(self, position, compress_ratio, width, slot):
        if slot < 0:
            return 0
        return max(0, (position + 1) // compress_ratio)


class TableRowByToken(RowBuilder):
    """Block-table row chosen by token index, not by token_to_req_indices."""

    def table_row(self, block_table, request, token):
        return block_table[token]


class TableStrideAssumed(RowBuilder):
    """Block table read as if its row stride were its width (ignores slicing)."""

    def table_row(self, block_table, request, token):
        width = block_table.shape[1]
        dense = block_table.as_strided(
            block_table.shape, (width, 1), block_table.storage_offset()
        )
        return dense[request]


class SlotWithoutBlockScale(RowBuilder):
    """Slot = block_table[r, j // B] + j % B, missing the * B."""

    def decode_slots(self, table_row, count, block_size):
        blocks_needed = _ceil_div(count, block_size)
        blocks = table_row[:blocks_needed].to(torch.int64)
        offsets = torch.arange(block_size, dtype=torch.int64, device=blocks.device)
        return (blocks[:, None] + offsets[None, :]).reshape(-1)[:count]


class SpillToBufferWidth(RowBuilder):
    """Sentinel tail written out to the buffer's full width instead of W."""

    def write_width(self, width, buffer):
        return buffer.shape[1]


class PrefillSentinelZero(RowBuilder):
    """Prefill columns j >= n hold 0 instead of -1."""

    def prefill_row(self, count, width, device):
        columns = torch.arange(width, dtype=torch.int64, device=device)
        return torch.where(columns < count, columns, torch.zeros_like(columns))


class PrefillRowNotRebased(RowBuilder):
    """Prefill token t written to prefill row t instead of t - num_decode_tokens."""

    def prefill_row_index(self, token, num_decode_tokens):
        return token


def _kernel_mutant(builder: RowBuilder) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        build_c128a_topk_metadata=builder.build,
        active_topk_width=correct.active_topk_width,
        capacity_width=correct.capacity_width,
    )


# ---------------------------------------------------------------------------
# Policy faults
# ---------------------------------------------------------------------------


def _width_without_tile_floor(max_seq_len, compress_ratio, capacity):
    needed = max_seq_len // compress_ratio
    if needed > capacity:
        raise ValueError(f"capacity {capacity} cannot cover {needed}")
    return min(_next_power_of_2(max(needed, 1)), capacity)


def _width_power_overshoots(max_seq_len, compress_ratio, capacity):
    needed = max_seq_len // compress_ratio
    if needed > capacity:
        raise ValueError(f"capacity {capacity} cannot cover {needed}")
    return min(max(1 << max(needed, 1).bit_length(), TILE), capacity)


def _width_never_refuses(max_seq_len, compress_ratio, capacity):
    needed = max_seq_len // compress_ratio
    return min(max(_next_power_of_2(max(needed, 1)), TILE), capacity)


def _width_from_rounded_up_count(max_seq_len, compress_ratio, capacity):
    needed = _ceil_div(max_seq_len, compress_ratio)
    if needed > capacity:
        raise ValueError(f"capacity {capacity} cannot cover {needed}")
    return min(max(_next_power_of_2(max(needed, 1)), TILE), capacity)


def _capacity_floor(max_model_len, compress_ratio):
    return (max_model_len // compress_ratio) // TILE * TILE


def _policy_mutant(active=None, capacity=None) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        build_c128a_topk_metadata=correct.build_c128a_topk_metadata,
        active_topk_width=active or correct.active_topk_width,
        capacity_width=capacity or correct.capacity_width,
    )


MUTANTS: dict[str, object] = {
    "packed_stride": _kernel_mutant(PackedStride()),
    "ceil_count": _kernel_mutant(CeilCount()),
    "count_one_ahead": _kernel_mutant(CountFromPosition()),
    "padding_lens_kept": _kernel_mutant(PaddingLensKept()),
    "padding_row_blanked": _kernel_mutant(PaddingRowBlanked()),
    "lens_unclamped": _kernel_mutant(LensUnclamped()),
    "table_row_by_token": _kernel_mutant(TableRowByToken()),
    "table_stride_assumed": _kernel_mutant(TableStrideAssumed()),
    "slot_without_block_scale": _kernel_mutant(SlotWithoutBlockScale()),
    "spill_to_buffer_width": _kernel_mutant(SpillToBufferWidth()),
    "prefill_sentinel_zero": _kernel_mutant(PrefillSentinelZero()),
    "prefill_row_not_rebased": _kernel_mutant(PrefillRowNotRebased()),
    "policy_no_tile_floor": _policy_mutant(active=_width_without_tile_floor),
    "policy_power_overshoots": _policy_mutant(active=_width_power_overshoots),
    "policy_never_refuses": _policy_mutant(active=_width_never_refuses),
    "policy_rounded_up_count": _policy_mutant(active=_width_from_rounded_up_count),
    "capacity_floor": _policy_mutant(capacity=_capacity_floor),
}

DESCRIPTIONS: dict[str, str] = {
    "packed_stride": (
        "writes and returns rows at stride W instead of the buffer's row stride C. "
        "Exposed by W < C with 2+ decode tokens (or any prefill token after a decode "
        "token): returned stride is W and buffer row 1 holds nothing new, e.g. C=256, "
        "W=128, two decode tokens."
    ),
    "ceil_count": (
        "n = ceil((p + 1) / R). Exposed by any token whose p + 1 is not a multiple "
        "of R, e.g. a prefill token at p = 0 (n must be 0, mutant gives 1)."
    ),
    "count_one_ahead": (
        "n = floor((p + 2) / R). Exposed by p = R - 2 = 126 (n must be 0, mutant 1) "
        "or p = 254 (n must be 1, mutant 2)."
    ),
    "padding_lens_kept": (
        "decode_lens = n for padding tokens. Exposed by a decode token with "
        "slot_mapping < 0 and p >= 127 (lens must be 0)."
    ),
    "padding_row_blanked": (
        "padding decode tokens' rows are all -1. Exposed by a decode token with "
        "slot_mapping < 0 and p >= 127 (row must still hold real slot ids)."
    ),
    "lens_unclamped": (
        "decode_lens = floor((p + 1) / R) without min(., W). Exposed by a real decode "
        "token past the active window, e.g. W = 128, p = 128 * 200 (lens must be 128)."
    ),
    "table_row_by_token": (
        "uses block_table[t] instead of block_table[token_to_req_indices[t]]. "
        "Exposed by speculative decode: two decode tokens of request 0 with "
        "distinct table rows, token 1 at p >= 127."
    ),
    "table_stride_assumed": (
        "reads block_table with row stride equal to its width. Exposed by a "
        "block_table that is a column slice of a wider table, decode token of "
        "request >= 1 with p >= 127."
    ),
    "slot_without_block_scale": (
        "slot = block_table[r, j // B] + j % B (missing * B). Exposed by any decode "
        "token with p >= 127 whose first block id is nonzero, e.g. block 7 gives 7 "
        "instead of 14."
    ),
    "spill_to_buffer_width": (
        "writes the -1 tail up to the buffer width instead of W. Exposed by W < C "
        "with any token: canaries in columns [W, C) are overwritten."
    ),
    "prefill_sentinel_zero": (
        "prefill columns j >= n hold 0 instead of -1. Exposed by any prefill token "
        "with n < W, e.g. p = 1000 at W = 128."
    ),
    "prefill_row_not_rebased": (
        "prefill token t written to row t, not t - num_decode_tokens. Exposed by a "
        "batch with 1+ decode tokens and 1+ prefill tokens (prefill row 0 keeps its "
        "canary)."
    ),
    "policy_no_tile_floor": (
        "W = min(next_pow2(max(m, 1)), C) without the floor of 128. Exposed by "
        "max_seq_len // R <= 64, e.g. max_seq_len = 1000, C = 8192 (W must be 128, "
        "mutant 8, not a multiple of 128)."
    ),
    "policy_power_overshoots": (
        "next power of two computed as 1 << m.bit_length(), doubling exact powers. "
        "Exposed by max_seq_len // R = 256, e.g. max_seq_len = 32768, C = 8192 "
        "(W must be 256, mutant 512)."
    ),
    "policy_never_refuses": (
        "no error when C < max_seq_len // R; silently returns C. Exposed by "
        "max_seq_len = 1,048,576 + 128 with C = capacity_width(1,048,576) = 8192 "
        "(must raise ValueError)."
    ),
    "policy_rounded_up_count": (
        "uses ceil(max_seq_len / R) instead of max_seq_len // R. Exposed by "
        "max_seq_len = 128 * 128 + 1 = 16385, C = 8192 (W must be 128, mutant 256)."
    ),
    "capacity_floor": (
        "C = floor(floor(max_model_len / R) / 128) * 128. Exposed by max_model_len "
        "= 100,000, R = 128 (C must be 896, mutant 768)."
    ),
}

assert MUTANTS.keys() == DESCRIPTIONS.keys()
