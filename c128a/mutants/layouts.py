"""Builder faults that only buffers placed as an engine's workspace places
them show: a storage offset, a row stride above the columns, one pool."""

from __future__ import annotations

import torch

from ..contract import BuildArgs, Views, returned_views
from ..contract import check_build_arguments as validated
from .builders import rows_of
from .registry import builder_mutant


def _write_at(args: BuildArgs, rows, place) -> None:
    """Write (decode, lens, prefill) through ``place(buffer, shape)``, the
    view a faulty builder believes each 2-D buffer's rows are."""
    decode, lens, prefill = rows
    place(args.global_decode_buffer, tuple(decode.shape)).copy_(decode)
    args.decode_lens_buffer[: lens.shape[0]] = lens
    place(args.prefill_buffer, tuple(prefill.shape)).copy_(prefill)


@builder_mutant(
    "addresses row r at r x (the buffer's column count), not r x its row stride: right "
    "for a contiguous buffer, rows in the wrong place when the row stride exceeds C",
    "packed stride",
    ("matches_oracle", "untouched_memory"),
    examples=50,  # measured: the ci profile's draws beside the covering array over every pair
)
def _build_row_stride_from_columns(args: BuildArgs) -> Views:
    validated(args)
    _write_at(args, rows_of(args),
              lambda buffer, shape: buffer.as_strided(shape, (buffer.shape[1], 1)))
    return returned_views(args)


@builder_mutant(
    "addresses its buffers from the start of their allocation (storage offset 0), as a "
    "kernel handed the storage's pointer would: right for a buffer of its own, wrong for "
    "a view at an offset or in a pool",
    "packed stride",
    ("adaptive_equals_full", "untouched_memory"),
)
def _build_ignores_storage_offset(args: BuildArgs) -> Views:
    validated(args)
    _write_at(args, rows_of(args),
              lambda buffer, shape: buffer.as_strided(shape, buffer.stride(), 0))
    return returned_views(args)


@builder_mutant(
    "writes the -1 sentinel across each written row's whole row stride, not only its "
    "columns < W: a row stride above C spills into the gap after the row",
    "spill past the row",
    ("untouched_memory",),
    examples=25,  # measured: the ci profile's draws beside the covering array over every pair
)
def _build_fills_row_stride_gap(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    for buffer, rows in ((args.global_decode_buffer, decode), (args.prefill_buffer, prefill)):
        span = buffer.stride(0)
        if rows.shape[0] and span > buffer.shape[1]:
            # The gap after each row, past the buffer's columns, as the loop reaches it.
            gap = buffer.as_strided((rows.shape[0], span - buffer.shape[1]), (span, 1),
                                    buffer.storage_offset() + buffer.shape[1])
            gap.fill_(-1)
        buffer[: rows.shape[0], : rows.shape[1]] = rows
    args.decode_lens_buffer[: lens.shape[0]] = lens
    return returned_views(args)
