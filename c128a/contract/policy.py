"""The builder-level width policy: which active width W a step uses.

W = min(max(next_power_of_2(max(max_seq_len // R, 1)), 128), C). Powers of two
keep the number of distinct widths (and so of kernel variants a consumer may
see) to log2(C / 128) + 2 at most; the 128 floor keeps W a multiple of
FlashMLA's decode tile; the capacity cap keeps W inside the buffers.
"""

from __future__ import annotations

import functools
import os

from ..failures import BadArgument, call_target
from .sizes import COMPRESS_RATIO, WIDTH_ALIGNMENT
from .validation import check, check_positive_int

BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"


def capacity_width(max_model_len: int, compress_ratio: int = COMPRESS_RATIO) -> int:
    """The buffers' column count C: compressed entries of the longest sequence,
    rounded up to a multiple of 128. 8192 at 1M context, 640 at 81,920."""
    check_positive_int("max_model_len", max_model_len)
    check_positive_int("compress_ratio", compress_ratio)
    entries = -(-max_model_len // compress_ratio)
    return -(-entries // WIDTH_ALIGNMENT) * WIDTH_ALIGNMENT


def batch_invariant_from_env() -> bool:
    value = os.environ.get(BATCH_INVARIANT_ENV, "0").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def next_power_of_2(value: int) -> int:
    """The smallest power of two >= ``value`` (1 for ``value`` <= 1)."""
    return 1 << max(value - 1, 0).bit_length()


def active_topk_width(
    max_seq_len: int,
    compress_ratio: int,
    capacity: int,
    *,
    batch_invariant: bool | None = None,
) -> int:
    """The active width W for a batch whose longest sequence is ``max_seq_len``.

    In batch-invariant mode (``batch_invariant=True``, or ``None`` and the
    environment variable ``VLLM_BATCH_INVARIANT`` set) W is pinned to the
    capacity so that no token's output depends on its neighbours.

    Raises :class:`~c128a.failures.BadArgument` when the capacity cannot hold
    ``max_seq_len // compress_ratio`` entries, instead of returning a width
    that would cut a token's list short.
    """
    # Plain ints in range skip the checks' messages: a sweep calls this often.
    if not (
        type(max_seq_len) is int and type(compress_ratio) is int and type(capacity) is int
        and max_seq_len >= 0 and compress_ratio > 0 and capacity > 0
        and capacity % WIDTH_ALIGNMENT == 0
    ):
        check(
            isinstance(max_seq_len, int) and not isinstance(max_seq_len, bool)
            and max_seq_len >= 0,
            f"max_seq_len={max_seq_len!r} must be an int >= 0",
        )
        check_positive_int("compress_ratio", compress_ratio)
        check_positive_int("capacity", capacity)
        check(
            capacity % WIDTH_ALIGNMENT == 0,
            f"capacity={capacity} must be a multiple of {WIDTH_ALIGNMENT}; "
            "use capacity_width(max_model_len) to size the buffers",
        )
    needed = max_seq_len // compress_ratio
    if needed > capacity:
        raise BadArgument(
            f"max_seq_len={max_seq_len} needs {needed} compressed entries "
            f"(max_seq_len // compress_ratio) but capacity={capacity}; "
            f"the buffers cover sequences up to {capacity * compress_ratio + compress_ratio - 1} "
            "tokens: size them from a larger max_model_len"
        )
    if batch_invariant is None:
        batch_invariant = batch_invariant_from_env()
    if batch_invariant:
        return capacity
    return min(max(next_power_of_2(max(needed, 1)), WIDTH_ALIGNMENT), capacity)


def reachable_widths(capacity: int) -> list[int]:
    """Every width the policy can return for this capacity, smallest first."""
    widths = {min(1 << k, capacity) for k in range(7, max(capacity.bit_length(), 8) + 1)}
    return sorted(w for w in widths if w <= capacity)


def capacity_only(max_seq_len: int, compress_ratio: int, capacity: int) -> int:
    """The width policy of a fixed-width builder, one its engine calls at
    W = C only (vLLM before #50004, and after its revert #51318): C for
    every step, refused like :func:`active_topk_width` where C cannot hold
    ``max_seq_len // compress_ratio`` entries."""
    active_topk_width(max_seq_len, compress_ratio, capacity, batch_invariant=True)
    return capacity


def target_reachable_widths(target, capacity: int, compress_ratio: int = COMPRESS_RATIO) -> list[int]:
    """The widths ``target``'s engine calls it at for this capacity, smallest
    first: the project's policy's (:func:`reachable_widths`) for a target
    held to it (and for None), C alone for a fixed-width builder, else the
    valid widths (positive multiples of 128, at most C) its own
    ``active_topk_width`` returns over every ``max_seq_len`` up to C x R
    (the project's where it returns none)."""
    if target is None or getattr(target, "uses_project_policy", True):
        return reachable_widths(capacity)
    if getattr(target, "fixed_width", False):
        return [capacity]
    return list(_swept_widths(target.active_topk_width, compress_ratio, capacity))


@functools.lru_cache(maxsize=256)
def _swept_widths(width_of, compress_ratio: int, capacity: int) -> tuple[int, ...]:
    widths = set()
    for needed in range(capacity + 1):
        # The first and last length of each needed count: where W can change.
        for max_seq_len in {needed * compress_ratio, needed * compress_ratio + compress_ratio - 1}:
            try:
                width = width_of(max_seq_len, compress_ratio, capacity)
            except Exception:  # noqa: BLE001 - a refusal; check_width_policy judges it
                continue
            if type(width) is int and 0 < width <= capacity and width % WIDTH_ALIGNMENT == 0:
                widths.add(width)
    return tuple(sorted(widths)) or tuple(reachable_widths(capacity))


def target_capacity(target, max_model_len: int, compress_ratio: int = COMPRESS_RATIO) -> int:
    """The capacity ``target``'s own policy gives (the project's when ``target``
    is None); whatever that raises is a :class:`~c128a.failures.TargetRaised`."""
    capacity_of = capacity_width if target is None else target.capacity_width
    return call_target("target_raised", "capacity_width", capacity_of, max_model_len,
                       compress_ratio)


def target_width(target, max_seq_len: int, compress_ratio: int, capacity: int) -> int:
    """The width ``target``'s own policy gives a step (the project's when
    ``target`` is None); whatever that raises is a :class:`~c128a.failures.TargetRaised`."""
    width_of = active_topk_width if target is None else target.active_topk_width
    return call_target("target_raised", "active_topk_width", width_of, max_seq_len,
                       compress_ratio, capacity)
