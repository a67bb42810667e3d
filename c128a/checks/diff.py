"""Readable diffs: the first place two results differ, with the token's story.

Every check reports through these, so a failure always names the buffer, the
first mismatching row and column, expected and actual values around it, the
token's position, request and slot, and W and the capacity.
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import phases
from ..failures import InvariantViolation
from ..step import Batch


def setting(batch: Batch, width: int) -> str:
    return (
        f"W={width}, capacity={batch.capacity}, max_model_len={batch.max_model_len}, "
        f"T={batch.num_tokens}, num_decode_tokens={batch.num_decode_tokens}"
    )


def token(batch: Batch, index: int) -> str:
    kind = "decode" if index < batch.num_decode_tokens else "prefill"
    position = batch.positions[index]
    n = (position + 1) // batch.compress_ratio
    return (
        f"token {index} ({kind}, position {position}, request "
        f"{batch.token_to_req_indices[index]}, slot_mapping {batch.slot_mapping[index]}, "
        f"(p + 1) // R = {n})"
    )


def window(row: torch.Tensor, column: int, span: int = 4) -> str:
    lo, hi = max(column - span, 0), min(column + span + 1, row.shape[0])
    return f"[{lo}:{hi}] = {row[lo:hi].tolist()}"


def first_difference(actual: torch.Tensor, expected: torch.Tensor, mask=None):
    """Index tuple of the first differing element (where ``mask`` is set), or None."""
    if actual.device != expected.device:
        actual, expected = actual.cpu(), expected.cpu()
    differs = actual != expected  # on the device: only the hit indices travel
    if mask is not None:
        differs &= mask.to(differs.device)
    hits = torch.nonzero(differs)
    return tuple(int(i) for i in hits[0]) if hits.numel() else None


def equal(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    if actual.device == expected.device:
        return torch.equal(actual, expected)  # no copy to the host
    return torch.equal(actual.cpu(), expected.cpu())


@phases.measured("comparison")
def all_equal(pairs) -> list[bool]:
    """torch.equal of each same-shaped (actual, expected) pair on one device,
    read back with one synchronisation."""
    if not pairs:
        return []
    flags = [
        (actual == expected).all()
        if actual.device == expected.device and actual.dtype == expected.dtype
        else torch.tensor(equal(actual, expected), device=expected.device)
        for actual, expected in pairs
    ]
    return torch.stack([f.to(flags[0].device) for f in flags]).tolist()


@phases.measured("comparison")
def compare_rows(
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
            + setting(batch, width),
        )
    if equal(actual, expected):
        return
    index = first_difference(actual, expected)
    row = index[0]
    if actual.dim() == 1:
        where, detail = f"{what}[{row}]", ""
    else:
        column = index[1]
        where = f"{what} row {row}, column {column}"
        detail = (
            f"\n  expected {window(expected[row].cpu(), column)}"
            f"\n  actual   {window(actual[row].cpu(), column)}"
        )
    raise InvariantViolation(
        invariant,
        f"{where}: expected {int(expected[index])}, got {int(actual[index])}{note}"
        f"\n  {token(batch, token_of_row(row))}\n  {setting(batch, width)}{detail}",
    )
