"""The checks one build allows: oracle equality, views, untouched memory, padding.

The written region of a build: decode rows ``< num_decode_tokens`` and prefill
rows ``< T - num_decode_tokens``, columns ``< W`` (``< C`` for the decode
buffer of a target with ``full_width_decode_views``); ``decode_lens`` rows
``< num_decode_tokens``. Nothing else may change. Each check raises
:class:`~c128a.failures.InvariantViolation` with a readable diff.

Values are compared on the host: a build is read back once
(:meth:`~c128a.step.BuildResult.on_host`) and the oracle runs on the CPU, so
that an example waits for the device as few times as it can.
"""

from __future__ import annotations

import torch

from ..contract import INERT, WIDTH_ALIGNMENT, Views, attended_lengths, padding_rows_of
from ..failures import InvariantViolation
from ..step import Batch, Buffers, BuildResult, build, oracle_build
from .diff import all_equal, compare_rows, setting, token, window


def decode_width(target, result: BuildResult) -> int:
    """Columns of the decode buffer a build owns: W, or C for full-width views."""
    if getattr(target, "full_width_decode_views", False):
        return result.buffers.global_decode.shape[1]
    return result.width


def expected_result(
    target, batch: Batch, width: int, device, decode_columns: int | None = None
) -> Views:
    """The oracle's (global_decode, decode_lens, prefill_local) for ``batch`` at
    ``width`` (decode rows at ``decode_columns``, W by default), as fresh
    tensors, under the padding-row variant ``target`` is held to: every
    check's expected values come from here."""
    decode_columns = width if decode_columns is None else decode_columns
    padding_rows = padding_rows_of(target)

    def run(w: int) -> BuildResult:
        buffers = Buffers.allocate(max(batch.num_tokens, 1), w, device)
        return oracle_build(batch, device, width=w, buffers=buffers, padding_rows=padding_rows)

    adaptive = run(width)
    decode_source = adaptive if decode_columns == width else run(decode_columns)
    # The buffers are this call's own, so their views are fresh tensors.
    return Views(decode_source.views[0], adaptive.views[1], adaptive.views[2])


def check_matches_oracle(target, result: BuildResult, expected: Views | None = None) -> None:
    """Invariant: the build equals the oracle on the written region, both in
    the returned views and in the buffers read at their own row stride.
    ``expected`` is the oracle's :func:`expected_result` when already known."""
    result = result.on_host()
    batch, width = result.batch, result.width
    columns = decode_width(target, result)
    if expected is None:
        expected = expected_result(target, batch, width, "cpu", columns)
    decode, lens, prefill = expected
    d, t = batch.num_decode_tokens, batch.num_tokens
    buffers = result.buffers
    stride_note = " (read at the buffer's row stride, as a consumer does)"
    # (what, actual, expected, token of row, note): buffers first, then the
    # returned views where their shape allows a comparison (views checks shapes).
    comparisons = [
        ("global_decode_buffer", buffers.global_decode[:d, :columns], decode,
         lambda r: r, stride_note),
        ("decode_lens_buffer", buffers.decode_lens[:d], lens, lambda r: r, ""),
        ("prefill_buffer", buffers.prefill[: t - d, :width], prefill, lambda r: r + d,
         stride_note),
    ]
    for what, view, expected, token_of_row in (
        ("returned global_decode", result.views[0], decode, lambda r: r),
        ("returned decode_lens", result.views[1], lens, lambda r: r),
        ("returned prefill_local", result.views[2], prefill, lambda r: r + d),
    ):
        if isinstance(view, torch.Tensor) and tuple(view.shape) == tuple(expected.shape):
            comparisons.append((what, view, expected, token_of_row, ""))
    comparable = [
        (actual, expected)
        for _, actual, expected, _, _ in comparisons
        if tuple(actual.shape) == tuple(expected.shape)
    ]
    if all(all_equal(comparable)) and len(comparable) == len(comparisons):
        return
    # Something differs: compare one by one, in order, for the first diff.
    for what, actual, expected, token_of_row, note in comparisons:
        compare_rows("matches_oracle", what, actual, expected, batch, width, token_of_row, note)


def check_views(target, result: BuildResult) -> None:
    """Invariant: views of shapes (D, W), (D,), (T - D, W), int32, on the
    buffers' own storage from their first element, with the buffers' row
    stride (never W). Full-width decode views are (D, C) and contiguous."""
    batch, width = result.batch, result.width
    d, t = batch.num_decode_tokens, batch.num_tokens
    name = "views"
    views = result.views
    specs = (
        ("global_decode", views[0], result.buffers.global_decode, (d, decode_width(target, result))),
        ("decode_lens", views[1], result.buffers.decode_lens, (d,)),
        ("prefill_local", views[2], result.buffers.prefill, (t - d, width)),
    )
    where = setting(batch, width)
    for what, view, buffer, shape in specs:
        if not isinstance(view, torch.Tensor):
            raise InvariantViolation(
                name, f"returned {what} is a {type(view).__name__}, not a tensor"
            )
        if tuple(view.shape) != shape:
            raise InvariantViolation(
                name, f"returned {what} has shape {tuple(view.shape)}, expected {shape}; {where}"
            )
        if view.dtype != torch.int32:
            raise InvariantViolation(name, f"returned {what} has dtype {view.dtype}, expected int32")
        if view.device != buffer.device:
            raise InvariantViolation(
                name, f"returned {what} is on {view.device}, its buffer on {buffer.device}"
            )
        if view.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr():
            raise InvariantViolation(
                name, f"returned {what} is not a view of its persistent buffer (other storage)"
            )
        if view.numel() and view.data_ptr() != buffer.data_ptr():
            offset = (view.data_ptr() - buffer.data_ptr()) // buffer.element_size()
            raise InvariantViolation(
                name, f"returned {what} starts {offset} elements into its buffer, not at row 0"
            )
        if view.stride() != buffer.stride():
            if view.dim() == 2:
                raise InvariantViolation(
                    name,
                    f"returned {what} has strides {view.stride()}, its buffer "
                    f"{buffer.stride()}: the row stride must stay the buffer's (C="
                    f"{buffer.shape[1]}), never W; a CUDA graph captured at one width "
                    f"reads every other width at the captured stride; {where}",
                )
            raise InvariantViolation(
                name, f"returned {what} has stride {view.stride()}, its buffer {buffer.stride()}"
            )


def check_untouched_memory(target, result: BuildResult, before: Buffers) -> None:
    """Invariant: every element outside the written region still holds what it
    held before the call (the poison, for fresh buffers): in the buffers, and
    in the rest of the memory they are views of (a storage offset's
    elements before them, the gaps between rows of a row stride above their
    columns, the other buffers of one pool)."""
    batch, width = result.batch, result.width
    d, t = batch.num_decode_tokens, batch.num_tokens
    after = result.on_host().buffers
    if before.global_decode.device != after.global_decode.device:
        before = before.host_copy()
    written = (
        ("global_decode_buffer", d, decode_width(target, result)),
        ("decode_lens_buffer", d, None),
        ("prefill_buffer", t - d, width),
    )
    masks = [torch.zeros(m.numel(), dtype=torch.bool) for m in after.memory]
    spans = []  # (allocation, first element, buffer name, buffer view, written rows, columns)
    for (what, rows, columns), buffer in zip(written, after.as_tuple()):
        index, offset = _place(after, buffer)
        region = masks[index].as_strided(buffer.shape, buffer.stride(), offset)
        if columns is None:
            region[:rows] = True
        else:
            region[:rows, :columns] = True
        spans.append((index, offset, what, buffer, rows, columns))
    for index, (now, was, mask) in enumerate(zip(after.memory, before.memory, masks)):
        changed = ~mask & (now.reshape(-1) != was.reshape(-1))
        hits = torch.nonzero(changed)
        if not hits.numel():
            continue
        element = int(hits[0])
        raise InvariantViolation(
            "untouched_memory",
            f"{_where(element, index, spans)} changed from "
            f"{int(was.reshape(-1)[element])} to {int(now.reshape(-1)[element])}; "
            f"{int(changed.sum())} element(s) outside the written region changed; "
            + setting(batch, width),
        )


def _place(buffers: Buffers, buffer: torch.Tensor) -> tuple[int, int]:
    """(allocation index, element offset in it) of one of ``buffers``."""
    for index, memory in enumerate(buffers.memory):
        if memory.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr():
            return index, buffer.storage_offset() - memory.storage_offset()
    raise AssertionError("a buffer outside its own allocations")


def _where(element: int, allocation: int, spans) -> str:
    """Element ``element`` of an allocation, named by the buffer, row and
    column it is (or the gap it lies in) for the diff."""
    for index, first, what, buffer, rows, columns in spans:
        if index != allocation or element < first:
            continue
        if columns is None:
            if element < first + buffer.shape[0]:
                return f"{what}[{element - first}] (only rows < {rows} may be written)"
            continue
        stride = buffer.stride(0)
        row, column = divmod(element - first, stride)
        if row >= buffer.shape[0]:
            continue
        if column >= buffer.shape[1]:
            return (
                f"the gap after {what} row {row} (element {column} of its row stride "
                f"{stride}, past its {buffer.shape[1]} columns)"
            )
        why = f"row {row} >= {rows} written rows" if row >= rows else f"column {column} >= W"
        return f"{what}[{row}, {column}] ({why})"
    return (
        f"element {element} of allocation {allocation}, outside every buffer (the "
        "memory around the buffers: a storage offset's elements, a pool's gaps)"
    )


def check_padding(target, result: BuildResult) -> None:
    """Invariant: -1 in columns [n(t), W) of every row; decode_lens 0 for
    padding tokens (negative slot); W a multiple of 128. Under the ``inert``
    padding-row variant a padding token's decode row is -1 in every column
    < W (n(t) = 0 for it)."""
    batch, width = result.batch, result.width
    name = "padding"
    if width % WIDTH_ALIGNMENT or width <= 0:
        raise InvariantViolation(
            name, f"W={width} is not a positive multiple of 128; " + setting(batch, width)
        )
    d, t = batch.num_decode_tokens, batch.num_tokens
    columns_of_decode = decode_width(target, result)
    positions = torch.tensor(batch.positions, dtype=torch.int64)
    inert = padding_rows_of(target) == INERT
    buffers = result.on_host().buffers
    padding = torch.tensor([s < 0 for s in batch.slot_mapping[:d]], dtype=torch.bool)
    for what, rows, first, columns, inert_rows in (
        ("global_decode_buffer", buffers.global_decode[:d, :columns_of_decode], 0,
         columns_of_decode, padding if inert else torch.zeros_like(padding)),
        ("prefill_buffer", buffers.prefill[: t - d, :width], d, width,
         torch.zeros(t - d, dtype=torch.bool)),
    ):
        token_positions = positions[first : first + rows.shape[0]]
        lengths = attended_lengths(token_positions, batch.compress_ratio, columns)
        lengths = torch.where(inert_rows, 0, lengths)
        tail = torch.arange(columns).unsqueeze(0) >= lengths.unsqueeze(1)
        hits = torch.nonzero(tail & (rows != -1))
        if not hits.numel():
            continue
        row, column = (int(i) for i in hits[0])
        got = int(rows[row, column])
        if inert_rows[row]:
            raise InvariantViolation(
                name,
                f"{what} row {row}, column {column}: the row of a padding token "
                f"(slot_mapping {batch.slot_mapping[row]} < 0) must be inert under "
                f"padding_rows='inert': expected -1 in every column < W={width}, got {got}"
                f"{_slot_id_note(batch, row, column, got)}"
                f"\n  actual {window(rows[row], column)}"
                f"\n  {token(batch, row)}\n  {setting(batch, width)}",
            )
        raise InvariantViolation(
            name,
            f"{what} row {row}, column {column}: expected the sentinel -1 past "
            f"n(t)={int(lengths[row])}, got {got}"
            f"\n  actual {window(rows[row], column)}"
            f"\n  {token(batch, row + first)}\n  {setting(batch, width)}",
        )
    lens = buffers.decode_lens[:d]
    for index in range(d):
        if batch.slot_mapping[index] < 0 and int(lens[index]) != 0:
            raise InvariantViolation(
                name,
                f"decode_lens_buffer[{index}] = {int(lens[index])} for a padding token "
                f"(slot_mapping < 0); expected 0\n  {token(batch, index)}\n  "
                + setting(batch, width),
            )


def _slot_id_note(batch: Batch, row: int, column: int, value: int) -> str:
    """Where ``value`` in decode row ``row`` is the slot id the block table
    gives that column, say so: the row publishes a physical cache index."""
    request, page_column = batch.token_to_req_indices[row], column // batch.block_size
    if not (0 <= request < len(batch.block_table)) or page_column >= batch.table_width:
        return ""
    page = batch.block_table[request][page_column]
    if value != page * batch.block_size + column % batch.block_size:
        return ""
    return (
        f": a slot id (block_table[{request}, {page_column}] * {batch.block_size} + "
        f"{column % batch.block_size}), what the 'slots' variant writes; the row publishes "
        "a physical cache index"
    )


def check_step(
    target, batch: Batch, device, *, buffers: Buffers | None = None,
    before: Buffers | None = None,
) -> BuildResult:
    """Build ``batch`` at ``batch.width`` into ``buffers`` (fresh, poisoned,
    when None) and check everything one build can: oracle equality, views,
    padding and sentinels, and untouched memory against ``before``, the
    buffers' contents before the call (a snapshot taken here when None).
    Returns the :class:`~c128a.step.BuildResult`."""
    if buffers is None:
        buffers = Buffers.for_batch(batch, device)
        before = Buffers.for_batch(batch, "cpu")  # the same poison, known without a read-back
    elif before is None:
        before = buffers.host_copy()
    result = build(target, batch, device, buffers=buffers)
    check_views(target, result)
    check_matches_oracle(target, result)
    check_padding(target, result)
    check_untouched_memory(target, result, before)
    return result

