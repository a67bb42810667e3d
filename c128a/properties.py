"""The property registry: every per-batch invariant as (strategy, check).

The fuzz runner, the kill matrix and the tests run the same properties. A
property's input is always a :class:`~c128a.batch.Batch`, so a failing input
is saved whole as JSON and replayed without Hypothesis. Each check builds what
it needs and calls one invariant of :mod:`c128a.invariants`, raising
:class:`~c128a.invariants.InvariantViolation` (an ``AssertionError``).

``width_policy`` is a Batch property too: it reads only the batch's
``max_model_len`` and sweeps every ``max_seq_len`` the engine can present
at that model length, so it needs no other input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from hypothesis.strategies import SearchStrategy

from . import invariants
from .batch import Batch, Buffers, build
from .strategies import HISTORICAL_BATCHES, batches

__all__ = ["PROPERTIES", "Property"]


@dataclass(frozen=True)
class Property:
    """One invariant, ready to run: ``check(target, strategy(target) example,
    device)`` raises ``AssertionError`` (``InvariantViolation``) on failure.
    ``strategy(target, max_tokens=N)`` draws engine steps of up to N tokens
    (more requests and longer prefill chunks) instead of the default size."""

    name: str
    strategy: Callable[..., SearchStrategy[Batch]]
    check: Callable[[object, Batch, torch.device], None]
    doc: str = ""
    examples: tuple[Batch, ...] = ()  # run first, as @example: the contract's history


def _matches_oracle(target, batch: Batch, device) -> None:
    invariants.check_matches_oracle(target, build(target.build_c128a_topk_metadata, batch, device))


def _views(target, batch: Batch, device) -> None:
    invariants.check_views(target, build(target.build_c128a_topk_metadata, batch, device))


def _untouched_memory(target, batch: Batch, device) -> None:
    buffers = Buffers.for_batch(batch, device)
    before = buffers.clone()
    result = build(target.build_c128a_topk_metadata, batch, device, buffers=buffers)
    invariants.check_untouched_memory(target, result, before)


def _padding(target, batch: Batch, device) -> None:
    invariants.check_padding(target, build(target.build_c128a_topk_metadata, batch, device))


def _width_policy(target, batch: Batch, device) -> None:
    invariants.check_width_policy(target, batch.max_model_len, batch.compress_ratio)


def _rejects_bad_input(target, batch: Batch, device) -> None:
    invariants.check_rejects_bad_input(target, batch, device)


def _token_budget(max_tokens: int | None) -> dict:
    """Keywords of :func:`batches` for steps of up to ``max_tokens`` tokens:
    enough decode requests (8 tokens each at most) and prefill chunk length
    to reach it; nothing (the default size) for None."""
    if max_tokens is None:
        return {}
    return {
        "max_tokens": max_tokens,
        "max_decode_requests": max(6, max_tokens // 8),
        "max_prefill_chunk": max(24, max_tokens // 4),
    }


def _engine_batches(target, max_tokens: int | None = None) -> SearchStrategy[Batch]:
    return batches(target, steer=True, **_token_budget(max_tokens))


def _policy_width_batches(target, max_tokens: int | None = None) -> SearchStrategy[Batch]:
    # Two builds, one at the full capacity (up to 8,192 columns): fewer tokens.
    return batches(target, widths="policy", steer=True, **_token_budget(max_tokens or 16))


def _policy_batches(target, max_tokens: int | None = None) -> SearchStrategy[Batch]:
    # Only max_model_len matters; no tokens keeps the draw cheap.
    return batches(target, max_tokens=0, max_buffer_rows=8)


def _property(name: str, check, strategy=_engine_batches, invariant=None) -> Property:
    doc = ((invariant or check).__doc__ or "").strip()
    examples = tuple(HISTORICAL_BATCHES.values())
    return Property(name=name, strategy=strategy, check=check, doc=doc, examples=examples)


PROPERTIES: dict[str, Property] = {
    prop.name: prop
    for prop in (
        _property("matches_oracle", _matches_oracle, invariant=invariants.check_matches_oracle),
        _property(
            "adaptive_equals_full", invariants.check_adaptive_equals_full, _policy_width_batches
        ),
        _property("views", _views, invariant=invariants.check_views),
        _property(
            "untouched_memory", _untouched_memory, invariant=invariants.check_untouched_memory
        ),
        _property("padding", _padding, invariant=invariants.check_padding),
        _property("idempotent", invariants.check_idempotent),
        _property("independent", invariants.check_independent),
        _property(
            "rejects_bad_input", _rejects_bad_input, invariant=invariants.check_rejects_bad_input
        ),
        _property(
            "width_policy", _width_policy, _policy_batches, invariant=invariants.check_width_policy
        ),
    )
}
"""Property name -> :class:`Property`; names match the tests and the kill matrix."""
