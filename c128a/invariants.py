"""The contract's invariants, one plain function each.

Every check raises :class:`InvariantViolation` (an ``AssertionError``) with a
readable diff: the invariant's name, the first mismatching row and column,
expected and actual values, the token's position, request and slot, and W and
the capacity. The tests and the fuzz runner both call these functions; neither
re-implements them. :func:`check_step` runs every check one build allows.

The written region of a build: decode rows ``< num_decode_tokens`` and prefill
rows ``< T - num_decode_tokens``, columns ``< W`` (``< C`` for the decode
buffer of a target with ``full_width_decode_views``); ``decode_lens`` rows
``< num_decode_tokens``. Nothing else may change.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from . import policy, reference
from .batch import Batch, BatchTensors, Buffers, BuildResult, build

__all__ = [
    "BAD_INPUTS",
    "BadInput",
    "InvariantViolation",
    "applicable_bad_inputs",
    "check_adaptive_equals_full",
    "check_idempotent",
    "check_independent",
    "check_matches_oracle",
    "check_padding",
    "check_rejects_bad_input",
    "check_step",
    "check_untouched_memory",
    "check_views",
    "check_width_policy",
    "expected_result",
    "is_project_target",
    "permuted_batch",
    "rotated_table_batch",
    "sub_batch",
]

CAPTURE_OVERSHOOT = (1, 2, 7, 8, 127, 128, 129, 255, 256, 1024)
"""How far past ``max_model_len`` a capture step's longest sequence may reach."""

PROJECT_TARGETS = frozenset({"triton", "reference", "c128a.kernel", "c128a.reference"})


class InvariantViolation(AssertionError):
    """A target broke an invariant of the contract; the message is the diff."""

    def __init__(self, invariant: str, message: str):
        self.invariant = invariant
        self.detail = message
        super().__init__(f"[{invariant}] {message}")

    def __reduce__(self):  # picklable across worker processes
        return (type(self), (self.invariant, self.detail))


# --------------------------------------------------------------------------- helpers


def _decode_width(target, result: BuildResult) -> int:
    """Columns of the decode buffer a build owns: W, or C for full-width views."""
    if getattr(target, "full_width_decode_views", False):
        return result.buffers.global_decode.shape[1]
    return result.width


def _setting(batch: Batch, width: int) -> str:
    return (
        f"W={width}, capacity={batch.capacity}, max_model_len={batch.max_model_len}, "
        f"T={batch.num_tokens}, num_decode_tokens={batch.num_decode_tokens}"
    )


def _token(batch: Batch, token: int) -> str:
    kind = "decode" if token < batch.num_decode_tokens else "prefill"
    position = batch.positions[token]
    slot = batch.slot_mapping[token]
    n = (position + 1) // batch.compress_ratio
    return (
        f"token {token} ({kind}, position {position}, request "
        f"{batch.token_to_req_indices[token]}, slot_mapping {slot}, "
        f"(p + 1) // R = {n})"
    )


def _window(row: torch.Tensor, column: int, span: int = 4) -> str:
    lo, hi = max(column - span, 0), min(column + span + 1, row.shape[0])
    return f"[{lo}:{hi}] = {row[lo:hi].tolist()}"


def _first_difference(actual: torch.Tensor, expected: torch.Tensor):
    """Index tuple of the first differing element, or None."""
    differs = actual.cpu() != expected.cpu()
    hits = torch.nonzero(differs)
    return tuple(int(i) for i in hits[0]) if hits.numel() else None


def _equal(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    if actual.device == expected.device:
        return torch.equal(actual, expected)  # no copy to the host
    return torch.equal(actual.cpu(), expected.cpu())


def _all_equal(pairs) -> list[bool]:
    """torch.equal of each same-shaped (actual, expected) pair on one device,
    read back with one synchronisation."""
    if not pairs:
        return []
    flags = [
        (actual == expected).all()
        if actual.device == expected.device and actual.dtype == expected.dtype
        else torch.tensor(_equal(actual, expected), device=expected.device)
        for actual, expected in pairs
    ]
    return torch.stack([f.to(flags[0].device) for f in flags]).tolist()


def _compare_rows(
    invariant: str,
    what: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    batch: Batch,
    width: int,
    token_of_row: Callable[[int], int],
    note: str = "",
) -> None:
    """Raise with the first mismatching (row, column) of two int tensors."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise InvariantViolation(
            invariant,
            f"{what} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}; "
            + _setting(batch, width),
        )
    if _equal(actual, expected):
        return
    index = _first_difference(actual, expected)
    row = index[0]
    token = token_of_row(row)
    if actual.dim() == 1:
        where = f"{what}[{row}]"
        detail = ""
    else:
        column = index[1]
        where = f"{what} row {row}, column {column}"
        detail = (
            f"\n  expected {_window(expected[row].cpu(), column)}"
            f"\n  actual   {_window(actual[row].cpu(), column)}"
        )
    exp_value = int(expected[index])
    act_value = int(actual[index])
    raise InvariantViolation(
        invariant,
        f"{where}: expected {exp_value}, got {act_value}{note}"
        f"\n  {_token(batch, token)}\n  {_setting(batch, width)}{detail}",
    )


def expected_result(batch: Batch, width: int, device, decode_width: int | None = None):
    """The oracle's (global_decode, decode_lens, prefill_local) for ``batch`` at
    ``width`` (decode rows at ``decode_width``, W by default), as fresh tensors.

    The oracle runs without its argument checks: batches come from the
    strategies, which only draw valid steps (tests/test_validation.py checks
    that), or from a case file, which :mod:`c128a.cases` checks on loading."""
    decode_width = width if decode_width is None else decode_width

    def run(w: int):
        rows = max(batch.num_tokens, 1)
        buffers = Buffers.allocate(rows, w, device)
        return build(reference.write_metadata, batch, device, width=w, buffers=buffers)

    adaptive = run(width)
    decode_source = adaptive if decode_width == width else run(decode_width)
    # The buffers are this call's own, so their views are fresh tensors.
    return decode_source.views[0], adaptive.views[1], adaptive.views[2]


# --------------------------------------------------------------------------- invariants


def check_matches_oracle(target, result: BuildResult) -> None:
    """Invariant: the build equals the oracle on the written region, both in
    the returned views and in the buffers read at their own row stride."""
    batch, width = result.batch, result.width
    decode_width = _decode_width(target, result)
    device = result.buffers.global_decode.device
    decode, lens, prefill = expected_result(batch, width, device, decode_width)
    d, t = batch.num_decode_tokens, batch.num_tokens
    name = "matches_oracle"
    buffers = result.buffers
    stride_note = " (read at the buffer's row stride, as a consumer does)"
    # (what, actual, expected, token of row, note): buffers first, then the
    # returned views where their shape allows a comparison (views checks shapes).
    comparisons = [
        ("global_decode_buffer", buffers.global_decode[:d, :decode_width], decode,
         lambda r: r, stride_note),
        ("decode_lens_buffer", buffers.decode_lens[:d], lens, lambda r: r, ""),
        ("prefill_buffer", buffers.prefill[: t - d, :width], prefill, lambda r: r + d,
         stride_note),
    ]
    views = result.views
    for what, view, expected, token_of_row in (
        ("returned global_decode", views[0], decode, lambda r: r),
        ("returned decode_lens", views[1], lens, lambda r: r),
        ("returned prefill_local", views[2], prefill, lambda r: r + d),
    ):
        if tuple(view.shape) == tuple(expected.shape):
            comparisons.append((what, view, expected, token_of_row, ""))
    comparable = [
        (actual, expected)
        for _, actual, expected, _, _ in comparisons
        if tuple(actual.shape) == tuple(expected.shape)
    ]
    if all(_all_equal(comparable)) and len(comparable) == len(comparisons):
        return
    # Something differs: compare one by one, in order, for the first diff.
    for what, actual, expected, token_of_row, note in comparisons:
        _compare_rows(name, what, actual, expected, batch, width, token_of_row, note)


def check_views(target, result: BuildResult) -> None:
    """Invariant: views of shapes (D, W), (D,), (T - D, W), int32, on the
    buffers' own storage from their first element, with the buffers' row
    stride (never W). Full-width decode views are (D, C) and contiguous."""
    batch, width = result.batch, result.width
    d, t = batch.num_decode_tokens, batch.num_tokens
    decode_width = _decode_width(target, result)
    name = "views"
    specs = (
        ("global_decode", result.views[0], result.buffers.global_decode, (d, decode_width)),
        ("decode_lens", result.views[1], result.buffers.decode_lens, (d,)),
        ("prefill_local", result.views[2], result.buffers.prefill, (t - d, width)),
    )
    setting = _setting(batch, width)
    for what, view, buffer, shape in specs:
        if not isinstance(view, torch.Tensor):
            raise InvariantViolation(
                name, f"returned {what} is a {type(view).__name__}, not a tensor"
            )
        if tuple(view.shape) != shape:
            raise InvariantViolation(
                name, f"returned {what} has shape {tuple(view.shape)}, expected {shape}; {setting}"
            )
        if view.dtype != torch.int32:
            raise InvariantViolation(
                name, f"returned {what} has dtype {view.dtype}, expected int32"
            )
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
        if view.dim() == 2:
            if view.stride() != buffer.stride():
                raise InvariantViolation(
                    name,
                    f"returned {what} has strides {view.stride()}, its buffer "
                    f"{buffer.stride()}: the row stride must stay the buffer's (C="
                    f"{buffer.shape[1]}), never W; a CUDA graph captured at one width "
                    f"reads every other width at the captured stride; {setting}",
                )
        elif view.stride() != buffer.stride():
            raise InvariantViolation(
                name, f"returned {what} has stride {view.stride()}, its buffer {buffer.stride()}"
            )


def check_untouched_memory(target, result: BuildResult, before: Buffers) -> None:
    """Invariant: every element outside the written region still holds what it
    held before the call (the poison, for fresh buffers)."""
    batch, width = result.batch, result.width
    d, t = batch.num_decode_tokens, batch.num_tokens
    decode_width = _decode_width(target, result)
    after = result.buffers
    regions = (
        ("global_decode_buffer", after.global_decode, before.global_decode, d, decode_width),
        ("prefill_buffer", after.prefill, before.prefill, t - d, width),
        ("decode_lens_buffer", after.decode_lens, before.decode_lens, d, None),
    )
    for what, now, was, rows, columns in regions:
        outside = torch.ones_like(now, dtype=torch.bool)
        if columns is None:
            outside[:rows] = False
        else:
            outside[:rows, :columns] = False
        changed = outside & (now != was)
        hits = torch.nonzero(changed)
        if not hits.numel():
            continue
        index = tuple(int(i) for i in hits[0])
        if columns is None:
            where = f"{what}[{index[0]}] (only rows < {rows} may be written)"
        else:
            row, column = index
            why = f"row {row} >= {rows} written rows" if row >= rows else f"column {column} >= W"
            where = f"{what}[{row}, {column}] ({why})"
        raise InvariantViolation(
            "untouched_memory",
            f"{where} changed from {int(was[index])} to {int(now[index])}; "
            f"{int(changed.sum())} element(s) outside the written region changed; "
            + _setting(batch, width),
        )


def check_padding(target, result: BuildResult) -> None:
    """Invariant: -1 in columns [n(t), W) of every row; decode_lens 0 for
    padding tokens (negative slot); W a multiple of 128."""
    batch, width = result.batch, result.width
    name = "padding"
    if width % policy.WIDTH_ALIGNMENT or width <= 0:
        raise InvariantViolation(
            name, f"W={width} is not a positive multiple of 128; " + _setting(batch, width)
        )
    d, t = batch.num_decode_tokens, batch.num_tokens
    decode_width = _decode_width(target, result)
    positions = torch.tensor(batch.positions, dtype=torch.int64)
    buffers = result.buffers
    for what, rows, first, columns in (
        ("global_decode_buffer", buffers.global_decode[:d, :decode_width].cpu(), 0, decode_width),
        ("prefill_buffer", buffers.prefill[: t - d, :width].cpu(), d, width),
    ):
        token_positions = positions[first : first + rows.shape[0]]
        lengths = reference.attended_lengths(token_positions, batch.compress_ratio, columns)
        tail = torch.arange(columns).unsqueeze(0) >= lengths.unsqueeze(1)
        wrong = tail & (rows != -1)
        hits = torch.nonzero(wrong)
        if hits.numel():
            row, column = (int(i) for i in hits[0])
            raise InvariantViolation(
                name,
                f"{what} row {row}, column {column}: expected the sentinel -1 past "
                f"n(t)={int(lengths[row])}, got {int(rows[row, column])}"
                f"\n  actual {_window(rows[row], column)}"
                f"\n  {_token(batch, row + first)}\n  {_setting(batch, width)}",
            )
    lens = buffers.decode_lens[:d].cpu()
    for token in range(d):
        if batch.slot_mapping[token] < 0 and int(lens[token]) != 0:
            raise InvariantViolation(
                name,
                f"decode_lens_buffer[{token}] = {int(lens[token])} for a padding token "
                f"(slot_mapping < 0); expected 0\n  {_token(batch, token)}\n  "
                + _setting(batch, width),
            )


def check_step(target, batch: Batch, device, *, buffers: Buffers | None = None) -> BuildResult:
    """Build ``batch`` at ``batch.width`` into ``buffers`` (fresh, poisoned,
    when None) and check everything one build can: oracle equality, views,
    padding and sentinels, and untouched memory against a snapshot taken
    before the call. Returns the :class:`BuildResult`."""
    if buffers is None:
        buffers = Buffers.for_batch(batch, device)
    before = buffers.clone()
    result = build(target.build_c128a_topk_metadata, batch, device, buffers=buffers)
    check_views(target, result)
    check_matches_oracle(target, result)
    check_padding(target, result)
    check_untouched_memory(target, result, before)
    return result


def check_adaptive_equals_full(target, batch: Batch, device) -> None:
    """Invariant: the build at W and the build at W = C agree on columns < W of
    every token row and on ``decode_lens`` (for W >= max_seq_len // R, the
    builder's precondition); both equal the oracle."""
    name = "adaptive_equals_full"
    adaptive = build(target.build_c128a_topk_metadata, batch, device)
    full = build(target.build_c128a_topk_metadata, batch, device, width=batch.capacity)
    d, t, width = batch.num_decode_tokens, batch.num_tokens, batch.width
    if width < batch.max_seq_len // batch.compress_ratio:
        # Below the builder's precondition the lists are cut by design: only
        # the oracle comparison below applies.
        d = t = 0
    a, f = adaptive.buffers, full.buffers
    _compare_rows(
        name,
        "global_decode_buffer (adaptive vs full width)",
        a.global_decode[:d, :width],
        f.global_decode[:d, :width],
        batch,
        width,
        lambda r: r,
        " (adaptive, full width expected)",
    )
    _compare_rows(
        name,
        "decode_lens_buffer (adaptive vs full width)",
        a.decode_lens[:d],
        f.decode_lens[:d],
        batch,
        width,
        lambda r: r,
        " (adaptive, full width expected)",
    )
    _compare_rows(
        name,
        "prefill_buffer (adaptive vs full width)",
        a.prefill[: t - d, :width],
        f.prefill[: t - d, :width],
        batch,
        width,
        lambda r: r + d,
        " (adaptive, full width expected)",
    )
    for result in (adaptive, full):
        try:
            check_matches_oracle(target, result)
        except InvariantViolation as exc:
            raise InvariantViolation(name, f"at W={result.width}: {exc}") from None


def check_idempotent(target, batch: Batch, device) -> None:
    """Invariant: building the same batch twice into the same buffers gives
    the same views and leaves the same buffers."""
    first = build(target.build_c128a_topk_metadata, batch, device)
    snapshot = first.buffers.clone()
    views = tuple(v.clone() for v in first.views)
    second = build(target.build_c128a_topk_metadata, batch, device, buffers=first.buffers)
    for what, was, now in zip(
        ("global_decode_buffer", "decode_lens_buffer", "prefill_buffer"),
        snapshot.as_tuple(),
        second.buffers.as_tuple(),
    ):
        index = _first_difference(now, was)
        if index is not None:
            raise InvariantViolation(
                "idempotent",
                f"second build changed {what}{list(index)} from {int(was[index])} to "
                f"{int(now[index])}; " + _setting(batch, batch.width),
            )
    names = ("global_decode", "decode_lens", "prefill_local")
    for what, was, now in zip(names, views, second.views):
        if tuple(was.shape) != tuple(now.shape) or not torch.equal(was.cpu(), now.cpu()):
            raise InvariantViolation(
                "idempotent", f"second build returned a different {what} view; "
                + _setting(batch, batch.width)
            )


def permuted_batch(batch: Batch) -> tuple[Batch, list[int]]:
    """The batch with its decode tokens and its prefill tokens each in reverse
    order; and, for each new token, the old token it was."""
    d, t = batch.num_decode_tokens, batch.num_tokens
    order = list(reversed(range(d))) + list(reversed(range(d, t)))
    permuted = dataclasses.replace(
        batch,
        positions=tuple(batch.positions[i] for i in order),
        token_to_req_indices=tuple(batch.token_to_req_indices[i] for i in order),
        slot_mapping=tuple(batch.slot_mapping[i] for i in order) + batch.slot_mapping[t:],
    )
    return permuted, order


def rotated_table_batch(batch: Batch) -> tuple[Batch, list[int]]:
    """The batch with its block-table rows rotated by one (request r moves to
    row r + 1, the last to row 0) and the decode tokens' request indices
    following them; every token stays in place."""
    rows = len(batch.block_table)
    d = batch.num_decode_tokens
    if rows == 0:
        return batch, list(range(batch.num_tokens))
    requests = [
        (r + 1) % rows if token < d else r for token, r in enumerate(batch.token_to_req_indices)
    ]
    rotated = dataclasses.replace(
        batch,
        token_to_req_indices=tuple(requests),
        block_table=batch.block_table[-1:] + batch.block_table[:-1],
    )
    return rotated, list(range(batch.num_tokens))


def sub_batch(batch: Batch) -> tuple[Batch, list[int]]:
    """Every other decode token and every other prefill token (the even ones),
    same table, same width; and, for each new token, the old token it was."""
    d, t = batch.num_decode_tokens, batch.num_tokens
    keep = list(range(0, d, 2)) + list(range(d, t, 2))
    smaller = dataclasses.replace(
        batch,
        positions=tuple(batch.positions[i] for i in keep),
        num_decode_tokens=len(range(0, d, 2)),
        token_to_req_indices=tuple(batch.token_to_req_indices[i] for i in keep),
        slot_mapping=tuple(batch.slot_mapping[i] for i in keep),
    )
    return smaller, keep


def _token_rows(result: BuildResult, decode_width: int):
    """Per token: (decode row or prefill row, decode_lens value or None)."""
    batch = result.batch
    d = batch.num_decode_tokens
    buffers = result.buffers
    rows = []
    for token in range(batch.num_tokens):
        if token < d:
            rows.append(
                (
                    buffers.global_decode[token, :decode_width].cpu(),
                    int(buffers.decode_lens[token]),
                )
            )
        else:
            rows.append((buffers.prefill[token - d, : result.width].cpu(), None))
    return rows


def check_independent(target, batch: Batch, device) -> None:
    """Invariant: a token's row (and decode_lens) does not depend on the other
    tokens: reversing the tokens, moving the requests to other block-table
    rows, or dropping every other token leaves each token's row unchanged."""
    if batch.num_tokens < 2:
        return
    original = build(target.build_c128a_topk_metadata, batch, device)
    decode_width = _decode_width(target, original)
    reference_rows = _token_rows(original, decode_width)
    for how, (other, source) in (
        ("with the tokens in reverse order", permuted_batch(batch)),
        ("with the requests' block-table rows rotated", rotated_table_batch(batch)),
        ("with every other token dropped", sub_batch(batch)),
    ):
        result = build(target.build_c128a_topk_metadata, other, device)
        rows = _token_rows(result, _decode_width(target, result))
        for new, old in enumerate(source):
            (row, lens), (expected_row, expected_lens) = rows[new], reference_rows[old]
            if lens != expected_lens or not torch.equal(row, expected_row):
                same_shape = row.shape == expected_row.shape
                index = _first_difference(row, expected_row) if same_shape else None
                column = index[0] if index else 0
                raise InvariantViolation(
                    "independent",
                    f"{_token(batch, old)} changed {how} (now token {new}): "
                    f"decode_lens {expected_lens} -> {lens}; first differing column "
                    f"{column}: {_window(expected_row, column)} -> {_window(row, column)}"
                    f"\n  {_setting(batch, batch.width)}",
                )


# --------------------------------------------------------------------------- width policy


def _accepts_batch_invariant(active_topk_width) -> bool:
    try:
        parameters = inspect.signature(active_topk_width).parameters
    except (TypeError, ValueError):
        return False
    return "batch_invariant" in parameters


def contract_capacity(max_model_len: int, compress_ratio: int = policy.COMPRESS_RATIO) -> int:
    """The contract's C = ceil(ceil(max_model_len / R) / 128) * 128."""
    entries = -(-max_model_len // compress_ratio)
    return -(-entries // policy.WIDTH_ALIGNMENT) * policy.WIDTH_ALIGNMENT


def contract_width(max_seq_len: int, compress_ratio: int, capacity: int) -> int:
    """The contract's W = min(max(next_power_of_2(max(max_seq_len // R, 1)), 128), C)."""
    needed = max(max_seq_len // compress_ratio, 1)
    return min(max(1 << (needed - 1).bit_length(), policy.WIDTH_ALIGNMENT), capacity)


def _policy_samples(max_model_len: int, ratio: int) -> list[int]:
    """Every max_seq_len where W can change, up to max_model_len: for each
    needed = max_seq_len // R, its first and last length, plus the edges."""
    samples = set()
    for needed in range(max_model_len // ratio + 1):
        samples.add(needed * ratio)
        samples.add(min(needed * ratio + ratio - 1, max_model_len))
    samples.update((0, 1, max_model_len - 1, max_model_len))
    return sorted(s for s in samples if 0 <= s <= max_model_len)


def check_width_policy(
    target, max_model_len: int, compress_ratio: int = policy.COMPRESS_RATIO
) -> None:
    """Invariant: for every max_seq_len the engine can present, W is a multiple
    of 128, covers max_seq_len // R, is <= C, is monotone, takes at most
    log2(C / 128) + 2 values, and is the contract's formula; C is the
    contract's capacity, a multiple of 128; a capture step slightly past
    max_model_len either gets such a W or the policy's ValueError; a policy
    with a ``batch_invariant`` keyword returns W = C when it is True."""
    name = "width_policy"
    capacity = target.capacity_width(max_model_len, compress_ratio)
    where = f"max_model_len={max_model_len}, capacity={capacity}"
    if capacity % policy.WIDTH_ALIGNMENT or capacity <= 0:
        raise InvariantViolation(
            name, f"capacity={capacity} is not a positive multiple of 128; {where}"
        )
    if capacity != contract_capacity(max_model_len, compress_ratio):
        raise InvariantViolation(
            name,
            f"capacity={capacity}, but ceil(ceil(max_model_len / R) / 128) * 128 = "
            f"{contract_capacity(max_model_len, compress_ratio)}; {where}",
        )
    needed_at_max = max_model_len // compress_ratio
    if capacity < needed_at_max:
        raise InvariantViolation(
            name, f"capacity={capacity} < max_model_len // R = {needed_at_max}; {where}"
        )

    keyword = _accepts_batch_invariant(target.active_topk_width)

    def width_of(max_seq_len: int):
        if keyword:  # outside batch-invariant mode, whatever the environment says
            return target.active_topk_width(
                max_seq_len, compress_ratio, capacity, batch_invariant=False
            )
        return target.active_topk_width(max_seq_len, compress_ratio, capacity)

    def width_ok(max_seq_len: int, width) -> str | None:
        if not isinstance(width, int) or isinstance(width, bool):
            return f"W={width!r} is not an int"
        if width % policy.WIDTH_ALIGNMENT or width <= 0:
            return f"W={width} is not a positive multiple of 128"
        if width < max_seq_len // compress_ratio:
            return f"W={width} < max_seq_len // R = {max_seq_len // compress_ratio}: lists are cut"
        if width > capacity:
            return f"W={width} > capacity={capacity}"
        expected = contract_width(max_seq_len, compress_ratio, capacity)
        if width != expected:
            return (
                f"W={width}, but min(max(next_power_of_2(max(max_seq_len // R, 1)), 128), C) "
                f"= {expected}"
            )
        return None

    previous, seen = None, set()
    for max_seq_len in _policy_samples(max_model_len, compress_ratio):
        width = width_of(max_seq_len)
        problem = width_ok(max_seq_len, width)
        if problem:
            raise InvariantViolation(name, f"max_seq_len={max_seq_len}: {problem}; {where}")
        if previous is not None and width < previous[1]:
            raise InvariantViolation(
                name,
                f"not monotone: max_seq_len={previous[0]} gets W={previous[1]} but "
                f"max_seq_len={max_seq_len} gets W={width}; {where}",
            )
        previous = (max_seq_len, width)
        seen.add(width)
    limit = max(capacity // policy.WIDTH_ALIGNMENT, 1).bit_length() - 1 + 2
    if len(seen) > limit:
        raise InvariantViolation(
            name,
            f"{len(seen)} distinct widths {sorted(seen)} > log2(C / 128) + 2 = {limit}; {where}",
        )
    for overshoot in CAPTURE_OVERSHOOT:
        max_seq_len = max_model_len + overshoot
        try:
            width = width_of(max_seq_len)
        except ValueError:
            continue  # the clear refusal the contract allows
        except Exception as exc:
            raise InvariantViolation(
                name,
                f"capture edge max_seq_len={max_seq_len}: raised {type(exc).__name__}: "
                f"{exc} instead of a width or a ValueError; {where}",
            ) from exc
        problem = width_ok(max_seq_len, width)
        if problem:
            raise InvariantViolation(
                name, f"capture edge max_seq_len={max_seq_len}: {problem}; {where}"
            )
    if not keyword:
        return  # the policy offers no batch-invariant mode
    for max_seq_len in (0, 1, max_model_len):
        width = target.active_topk_width(
            max_seq_len, compress_ratio, capacity, batch_invariant=True
        )
        if width != capacity:
            raise InvariantViolation(
                name,
                f"batch-invariant mode (batch_invariant=True): max_seq_len={max_seq_len} "
                f"gets W={width}, expected W = capacity = {capacity}; {where}",
            )


# --------------------------------------------------------------------------- bad input


def is_project_target(target) -> bool:
    """The project's own targets also check what the contract does not oblige
    a third-party builder to check (dtypes, devices, counts, table rows)."""
    return str(getattr(target, "spec", "")) in PROJECT_TARGETS


@dataclass(frozen=True)
class BadInput:
    """One way to break the builder's arguments.

    ``mutate(args, batch)`` returns a changed copy of the argument dict;
    ``argument`` must appear in the ValueError's message. ``contract`` marks
    the contract's own preconditions, which every validating target checks;
    the others are the project's extra checks. ``needs`` says what the batch must have for
    the case to apply: "", "tokens", "two tokens", "decode", "decode entries"
    or "two buffer rows".
    """

    name: str
    argument: str
    contract: bool
    mutate: Callable[[dict, Batch], dict]
    needs: str = ""

    def applies(self, batch: Batch) -> bool:
        if self.needs == "tokens":
            return batch.num_tokens > 0
        if self.needs == "decode":
            return batch.num_decode_tokens > 0
        if self.needs == "decode entries":
            return _table_columns_needed(batch) > 0
        if self.needs == "two tokens":
            return batch.num_tokens >= 2
        if self.needs == "two buffer rows":
            return batch.buffer_rows >= 2
        return True


def _table_columns_needed(batch: Batch) -> int:
    """Block-table columns the batch's decode tokens read at its width."""
    entries = [
        min((p + 1) // batch.compress_ratio, batch.width)
        for p in batch.positions[: batch.num_decode_tokens]
    ]
    return max((-(-n // batch.block_size) for n in entries), default=0)


def _with(args: dict, **changes) -> dict:
    return {**args, **changes}


def _every_other(vector: torch.Tensor) -> torch.Tensor:
    """The same values at stride 2: a view the kernels must not index densely."""
    return vector.repeat_interleave(2)[::2]


def _strided(buffer: torch.Tensor) -> torch.Tensor:
    wide = torch.full(
        (buffer.shape[0], buffer.shape[1] * 2), -99, dtype=buffer.dtype, device=buffer.device
    )
    return wide[:, ::2]


BAD_INPUTS: tuple[BadInput, ...] = (
    BadInput(
        "width_not_multiple_of_128",
        "max_compressed_tokens",
        True,
        lambda a, b: _with(a, max_compressed_tokens=a["max_compressed_tokens"] - 64),
    ),
    BadInput(
        "width_zero", "max_compressed_tokens", True, lambda a, b: _with(a, max_compressed_tokens=0)
    ),
    BadInput(
        "width_negative",
        "max_compressed_tokens",
        True,
        lambda a, b: _with(a, max_compressed_tokens=-128),
    ),
    BadInput(
        "width_wider_than_buffers",
        "max_compressed_tokens",
        True,
        lambda a, b: _with(a, max_compressed_tokens=a["global_decode_buffer"].shape[1] + 128),
    ),
    BadInput(
        "width_wider_than_prefill_buffer",
        "prefill_buffer",
        True,
        lambda a, b: _with(
            a,
            max_compressed_tokens=a["global_decode_buffer"].shape[1],
            prefill_buffer=a["prefill_buffer"][:, : a["global_decode_buffer"].shape[1] - 128],
        ),
    ),
    BadInput(
        "decode_buffer_last_stride_not_1",
        "global_decode_buffer",
        True,
        lambda a, b: _with(a, global_decode_buffer=_strided(a["global_decode_buffer"])),
    ),
    BadInput(
        "prefill_buffer_last_stride_not_1",
        "prefill_buffer",
        True,
        lambda a, b: _with(a, prefill_buffer=_strided(a["prefill_buffer"])),
    ),
    BadInput(
        "positions_not_dense",
        "positions",
        False,
        lambda a, b: _with(a, positions=_every_other(a["positions"])),
        needs="two tokens",
    ),
    BadInput(
        "token_to_req_indices_not_dense",
        "token_to_req_indices",
        False,
        lambda a, b: _with(a, token_to_req_indices=_every_other(a["token_to_req_indices"])),
        needs="two tokens",
    ),
    BadInput(
        "slot_mapping_not_dense",
        "slot_mapping",
        False,
        lambda a, b: _with(a, slot_mapping=_every_other(a["slot_mapping"])),
        needs="two tokens",
    ),
    BadInput(
        "decode_lens_buffer_not_dense",
        "decode_lens_buffer",
        False,
        lambda a, b: _with(a, decode_lens_buffer=_every_other(a["decode_lens_buffer"])),
        needs="two buffer rows",
    ),
    BadInput(
        "position_negative",
        "positions",
        False,
        lambda a, b: _with(a, positions=torch.cat([a["positions"][:-1], a["positions"][-1:] * 0 - 5])),
        needs="tokens",
    ),
    BadInput(
        "token_to_req_indices_shorter_than_T",
        "token_to_req_indices",
        False,
        lambda a, b: _with(a, token_to_req_indices=a["token_to_req_indices"][: b.num_tokens - 1]),
        needs="tokens",
    ),
    BadInput(
        "request_index_negative",
        "token_to_req_indices",
        False,
        lambda a, b: _with(
            a,
            token_to_req_indices=torch.cat(
                [a["token_to_req_indices"][:1] * 0 - 1, a["token_to_req_indices"][1:]]
            ),
        ),
        needs="decode",
    ),
    BadInput("compress_ratio_zero", "compress_ratio", False, lambda a, b: _with(a, compress_ratio=0)),
    BadInput("block_size_zero", "block_size", False, lambda a, b: _with(a, block_size=0)),
    BadInput(
        "width_not_an_int",
        "max_compressed_tokens",
        False,
        lambda a, b: _with(a, max_compressed_tokens=float(a["max_compressed_tokens"])),
    ),
    BadInput(
        "positions_wrong_dtype",
        "positions",
        False,
        lambda a, b: _with(a, positions=a["positions"].to(torch.int32)),
    ),
    BadInput(
        "token_to_req_indices_wrong_dtype",
        "token_to_req_indices",
        False,
        lambda a, b: _with(a, token_to_req_indices=a["token_to_req_indices"].to(torch.int64)),
    ),
    BadInput(
        "block_table_wrong_dtype",
        "block_table",
        False,
        lambda a, b: _with(a, block_table=a["block_table"].to(torch.int64)),
    ),
    BadInput(
        "slot_mapping_wrong_dtype",
        "slot_mapping",
        False,
        lambda a, b: _with(a, slot_mapping=a["slot_mapping"].to(torch.int32)),
    ),
    BadInput(
        "decode_buffer_wrong_dtype",
        "global_decode_buffer",
        False,
        lambda a, b: _with(
            a,
            global_decode_buffer=torch.full_like(
                a["global_decode_buffer"], -99, dtype=torch.int64
            ),
        ),
    ),
    BadInput(
        "decode_lens_buffer_wrong_dtype",
        "decode_lens_buffer",
        False,
        lambda a, b: _with(
            a, decode_lens_buffer=torch.full_like(a["decode_lens_buffer"], -99, dtype=torch.int64)
        ),
    ),
    BadInput(
        "decode_lens_buffer_wrong_device",
        "decode_lens_buffer",
        False,
        lambda a, b: _with(a, decode_lens_buffer=a["decode_lens_buffer"].to("meta")),
    ),
    BadInput(
        "prefill_buffer_wrong_device",
        "prefill_buffer",
        False,
        lambda a, b: _with(a, prefill_buffer=a["prefill_buffer"].to("meta")),
    ),
    BadInput(
        "num_decode_tokens_above_T",
        "num_decode_tokens",
        False,
        lambda a, b: _with(a, num_decode_tokens=b.num_tokens + 1),
    ),
    BadInput(
        "num_decode_tokens_negative",
        "num_decode_tokens",
        False,
        lambda a, b: _with(a, num_decode_tokens=-1),
    ),
    BadInput(
        "slot_mapping_shorter_than_T",
        "slot_mapping",
        False,
        lambda a, b: _with(a, slot_mapping=a["slot_mapping"][: b.num_tokens - 1]),
        needs="tokens",
    ),
    BadInput(
        "block_table_too_few_rows",
        "block_table",
        False,
        lambda a, b: _with(
            a, block_table=a["block_table"][: max(b.token_to_req_indices[: b.num_decode_tokens])]
        ),
        needs="decode",
    ),
    BadInput(
        "block_table_too_few_columns",
        "block_table",
        False,
        lambda a, b: _with(a, block_table=a["block_table"][:, : _table_columns_needed(b) - 1]),
        needs="decode entries",
    ),
)
"""Every bad input of the builder's contract and of the project's checks."""


def applicable_bad_inputs(target) -> tuple[BadInput, ...]:
    """The cases a target must reject: all for the project's targets, the
    contract's preconditions for any other validating target, none when the
    target declares ``validates_input=False``."""
    if not getattr(target, "validates_input", True):
        return ()
    return tuple(case for case in BAD_INPUTS if case.contract or is_project_target(target))


def _arguments(batch: Batch, tensors: BatchTensors, buffers: Buffers) -> dict:
    return {
        "positions": tensors.positions,
        "compress_ratio": batch.compress_ratio,
        "num_decode_tokens": batch.num_decode_tokens,
        "token_to_req_indices": tensors.token_to_req_indices,
        "block_table": tensors.block_table,
        "block_size": batch.block_size,
        "slot_mapping": tensors.slot_mapping,
        "global_decode_buffer": buffers.global_decode,
        "decode_lens_buffer": buffers.decode_lens,
        "prefill_buffer": buffers.prefill,
        "max_compressed_tokens": batch.width,
    }


BUFFER_ARGUMENTS = ("global_decode_buffer", "decode_lens_buffer", "prefill_buffer")


def check_rejects_bad_input(target, batch: Batch, device, cases=None) -> None:
    """Invariant: each bad variant of ``batch``'s arguments raises a ValueError
    that names the argument, and leaves every buffer as it was."""
    cases = applicable_bad_inputs(target) if cases is None else cases
    cases = [case for case in cases if case.applies(batch)]
    if not cases:
        return
    # One set of buffers for every case: a rejected call writes nothing, and
    # the first case that writes fails the check.
    buffers = Buffers.for_batch(batch, device)
    snapshot = buffers.clone()
    tensors = batch.tensors(device)
    for case in cases:
        args = case.mutate(_arguments(batch, tensors, buffers), batch)
        substitutes = [
            args[key]
            for key, own in zip(BUFFER_ARGUMENTS, buffers.as_tuple())
            if args[key] is not own and args[key].device.type != "meta"
        ]
        substitute_snapshots = [b.clone() for b in substitutes]
        try:
            target.build_c128a_topk_metadata(*args.values())
        except ValueError as exc:
            if case.argument not in str(exc):
                raise InvariantViolation(
                    "rejects_bad_input",
                    f"{case.name}: the ValueError does not name {case.argument!r}: {exc}",
                ) from exc
        except Exception as exc:
            raise InvariantViolation(
                "rejects_bad_input",
                f"{case.name}: raised {type(exc).__name__} (not a ValueError naming "
                f"{case.argument!r}): {exc}",
            ) from exc
        else:
            raise InvariantViolation(
                "rejects_bad_input",
                f"{case.name}: accepted {case.argument} without raising ValueError; "
                + _setting(batch, batch.width),
            )
        pairs = list(zip(buffers.as_tuple(), snapshot.as_tuple()))
        pairs += list(zip(substitutes, substitute_snapshots))
        for buffer, before in pairs:
            if not torch.equal(buffer, before):
                index = _first_difference(buffer, before)
                raise InvariantViolation(
                    "rejects_bad_input",
                    f"{case.name}: raised, but first wrote a buffer: element {list(index)} "
                    f"changed from {int(before[index])} to {int(buffer[index])}",
                )
