"""Checks that compare two builds: adaptive against full width, a build
against itself, a token against the same token in another batch."""

from __future__ import annotations

import dataclasses

import torch

from ..failures import InvariantViolation
from ..step import Batch, BuildResult, build
from ..step.buffers import results_on_host, to_host
from .diff import compare_rows, first_difference, setting, token, window
from .one_build import check_matches_oracle, decode_width


def check_adaptive_equals_full(target, batch: Batch, device) -> None:
    """Invariant: the build at W and the build at W = C agree on columns < W of
    every token row and on ``decode_lens`` (for W >= max_seq_len // R, the
    builder's precondition); both equal the oracle."""
    name = "adaptive_equals_full"
    adaptive = build(target, batch, device)
    full = build(target, batch, device, width=batch.widest_width)
    adaptive, full = results_on_host(adaptive, full)
    d, t, width = batch.num_decode_tokens, batch.num_tokens, batch.width
    if width < batch.max_seq_len // batch.compress_ratio:
        # Below the builder's precondition the lists are cut by design: only
        # the oracle comparison below applies.
        d = t = 0
    a, f = adaptive.buffers, full.buffers
    note = " (adaptive, full width expected)"
    for what, actual, expected, token_of_row in (
        ("global_decode_buffer", a.global_decode[:d, :width], f.global_decode[:d, :width],
         lambda r: r),
        ("decode_lens_buffer", a.decode_lens[:d], f.decode_lens[:d], lambda r: r),
        ("prefill_buffer", a.prefill[: t - d, :width], f.prefill[: t - d, :width],
         lambda r: r + d),
    ):
        compare_rows(name, f"{what} (adaptive vs full width)", actual, expected, batch, width,
                     token_of_row, note)
    for result in (adaptive, full):
        try:
            check_matches_oracle(target, result)
        except InvariantViolation as exc:
            raise InvariantViolation(name, f"at W={result.width}: {exc}") from None


def check_idempotent(target, batch: Batch, device) -> None:
    """Invariant: building the same batch twice into the same buffers gives
    the same views and leaves the same buffers."""
    first = build(target, batch, device)
    snapshot = to_host([*first.buffers.as_tuple(), *first.views], copy=True)
    views = snapshot[3:]
    second = build(target, batch, device, buffers=first.buffers).on_host()
    for what, was, now in zip(
        ("global_decode_buffer", "decode_lens_buffer", "prefill_buffer"),
        snapshot[:3],
        second.buffers.as_tuple(),
    ):
        index = first_difference(now, was)
        if index is not None:
            raise InvariantViolation(
                "idempotent",
                f"second build changed {what}{list(index)} from {int(was[index])} to "
                f"{int(now[index])}; " + setting(batch, batch.width),
            )
    for what, was, now in zip(("global_decode", "decode_lens", "prefill_local"), views,
                              second.views):
        if tuple(was.shape) != tuple(now.shape) or not torch.equal(was, now):
            raise InvariantViolation(
                "idempotent",
                f"second build returned a different {what} view; " + setting(batch, batch.width),
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
        (r + 1) % rows if index < d else r for index, r in enumerate(batch.token_to_req_indices)
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


def _token_rows(result: BuildResult, columns: int):
    """Per token: (decode row or prefill row, decode_lens value or None)."""
    batch = result.batch
    d = batch.num_decode_tokens
    buffers = result.on_host().buffers
    lens = buffers.decode_lens[:d].tolist()
    rows = []
    for index in range(batch.num_tokens):
        if index < d:
            rows.append((buffers.global_decode[index, :columns], lens[index]))
        else:
            rows.append((buffers.prefill[index - d, : result.width], None))
    return rows


def check_independent(target, batch: Batch, device) -> None:
    """Invariant: a token's row (and decode_lens) does not depend on the other
    tokens: reversing the tokens, moving the requests to other block-table
    rows, or dropping every other token leaves each token's row unchanged."""
    if batch.num_tokens < 2:
        return
    variants = (
        ("with the tokens in reverse order", permuted_batch(batch)),
        ("with the requests' block-table rows rotated", rotated_table_batch(batch)),
        ("with every other token dropped", sub_batch(batch)),
    )
    # All four builds first, then one read-back for all of them.
    original, *others = results_on_host(
        build(target, batch, device), *(build(target, other, device) for _, (other, _) in variants)
    )
    reference_rows = _token_rows(original, decode_width(target, original))
    for (how, (_, source)), result in zip(variants, others):
        rows = _token_rows(result, decode_width(target, result))
        for new, old in enumerate(source):
            (row, lens), (expected_row, expected_lens) = rows[new], reference_rows[old]
            if lens != expected_lens or not torch.equal(row, expected_row):
                same_shape = row.shape == expected_row.shape
                index = first_difference(row, expected_row) if same_shape else None
                column = index[0] if index else 0
                raise InvariantViolation(
                    "independent",
                    f"{token(batch, old)} changed {how} (now token {new}): "
                    f"decode_lens {expected_lens} -> {lens}; first differing column "
                    f"{column}: {window(expected_row, column)} -> {window(row, column)}"
                    f"\n  {setting(batch, batch.width)}",
                )
