"""The width policy: W and C for every step the engine can present."""

from __future__ import annotations

import inspect

import numpy as np

from .. import phases
from ..contract import COMPRESS_RATIO, WIDTH_ALIGNMENT
from ..failures import ContractViolation, InvariantViolation, call_target, target_raised

CAPTURE_OVERSHOOT = (1, 2, 7, 8, 127, 128, 129, 255, 256, 1024)
"""How far past ``max_model_len`` a capture step's longest sequence may reach."""


def _accepts_batch_invariant(active_topk_width) -> bool:
    try:
        parameters = inspect.signature(active_topk_width).parameters
    except (TypeError, ValueError):
        return False
    return "batch_invariant" in parameters


def contract_capacity(max_model_len: int, compress_ratio: int = COMPRESS_RATIO) -> int:
    """The contract's C = ceil(ceil(max_model_len / R) / 128) * 128."""
    entries = -(-max_model_len // compress_ratio)
    return -(-entries // WIDTH_ALIGNMENT) * WIDTH_ALIGNMENT


def contract_width(max_seq_len: int, compress_ratio: int, capacity: int) -> int:
    """The contract's W = min(max(next_power_of_2(max(max_seq_len // R, 1)), 128), C)."""
    return _contract_widths([max_seq_len], compress_ratio, capacity)[0]


def _policy_samples(max_model_len: int, ratio: int) -> list[int]:
    """Every max_seq_len where W can change, up to max_model_len: for each
    needed = max_seq_len // R, its first and last length, plus the edges
    (sorted, each once; numpy: a sweep has thousands)."""
    firsts = np.arange(max_model_len // ratio + 1, dtype=np.int64) * ratio
    samples = np.unique(np.concatenate((
        firsts,
        np.minimum(firsts + ratio - 1, max_model_len),
        (0, 1, max_model_len - 1, max_model_len),
    )))
    return samples[(samples >= 0) & (samples <= max_model_len)].tolist()


def _contract_widths(samples: list[int], ratio: int, capacity: int) -> list[int]:
    """:func:`contract_width` of every sample, at once (a sweep has thousands)."""
    needed = np.maximum(np.asarray(samples, dtype=np.int64) // ratio, 1)
    # frexp's exponent of needed - 1 is its bit length (exact below 2**53)
    _, bits = np.frexp((needed - 1).astype(np.float64))
    widths = np.left_shift(np.int64(1), bits.astype(np.int64))
    return np.minimum(np.maximum(widths, WIDTH_ALIGNMENT), capacity).tolist()


@phases.measured("target")
def _widths_of(invariant: str, width_of, samples) -> list:
    """``width_of`` of every sample, in one phase; what it raises is a
    :class:`~c128a.failures.TargetRaised` naming the sample."""
    widths = []
    try:
        for max_seq_len in samples:
            widths.append(width_of(max_seq_len))
    except ContractViolation:
        raise
    except Exception as exc:
        what = f"active_topk_width({samples[len(widths)]}, ...)"
        raise target_raised(invariant, what, exc) from exc
    return widths


def check_width_policy(
    target, max_model_len: int, compress_ratio: int = COMPRESS_RATIO
) -> None:
    """Invariant: for every max_seq_len the engine can present, W is a multiple
    of 128, covers max_seq_len // R, is <= C, is monotone, takes at most
    log2(C / 128) + 2 values, and is the contract's formula; C is the
    contract's capacity, a multiple of 128; a capture step slightly past
    max_model_len either gets such a W or the policy's ValueError; a policy
    with a ``batch_invariant`` keyword returns W = C when it is True. For a
    target declaring a fixed width the formula is W = C."""
    name = "width_policy"
    with phases.phase("target"):
        capacity = call_target(name, "capacity_width", target.capacity_width, max_model_len,
                               compress_ratio)
    where = f"max_model_len={max_model_len}, capacity={capacity}"
    if capacity % WIDTH_ALIGNMENT or capacity <= 0:
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
        # Outside batch-invariant mode, whatever the environment says.
        options = {"batch_invariant": False} if keyword else {}
        return target.active_topk_width(max_seq_len, compress_ratio, capacity, **options)

    def width_ok(max_seq_len: int, width, expected: int) -> str | None:
        if not isinstance(width, int) or isinstance(width, bool):
            return f"W={width!r} is not an int"
        if width % WIDTH_ALIGNMENT or width <= 0:
            return f"W={width} is not a positive multiple of 128"
        if width < max_seq_len // compress_ratio:
            return f"W={width} < max_seq_len // R = {max_seq_len // compress_ratio}: lists are cut"
        if width > capacity:
            return f"W={width} > capacity={capacity}"
        if width != expected and fixed:
            return (f"W={width}, but the target declares a fixed width "
                    f"({target.fixed_width_origin}): W = C = {expected}")
        if width != expected:
            return (
                f"W={width}, but min(max(next_power_of_2(max(max_seq_len // R, 1)), 128), C) "
                f"= {expected}"
            )
        return None

    samples = _policy_samples(max_model_len, compress_ratio)
    widths = _widths_of(name, width_of, samples)
    # The sweep has thousands of samples: where every W is the contract's
    # (a plain int equal to the formula, which has every other property
    # below), the first problem need not be looked for one sample at a time.
    # A fixed-width builder's engine calls it at W = C only.
    fixed = bool(getattr(target, "fixed_width", False))
    expected = ([capacity] * len(samples) if fixed
                else _contract_widths(samples, compress_ratio, capacity))
    if {type(width) for width in widths} <= {int} and widths == expected:
        samples, seen = (), set(widths)
    else:
        seen = set()  # filled as the samples pass (a W may be unhashable)
    previous = None
    for max_seq_len, width, want in zip(samples, widths, expected):
        problem = width_ok(max_seq_len, width, want)
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
    limit = max(capacity // WIDTH_ALIGNMENT, 1).bit_length() - 1 + 2
    if len(seen) > limit:
        raise InvariantViolation(
            name,
            f"{len(seen)} distinct widths {sorted(seen)} > log2(C / 128) + 2 = {limit}; {where}",
        )
    for overshoot in CAPTURE_OVERSHOOT:
        max_seq_len = max_model_len + overshoot
        try:
            with phases.phase("target"):
                width = width_of(max_seq_len)
        except ValueError:
            continue  # the clear refusal the contract allows
        except Exception as exc:
            raise InvariantViolation(
                name,
                f"capture edge max_seq_len={max_seq_len}: raised {type(exc).__name__}: "
                f"{exc} instead of a width or a ValueError; {where}",
            ) from exc
        want = capacity if fixed else contract_width(max_seq_len, compress_ratio, capacity)
        problem = width_ok(max_seq_len, width, want)
        if problem:
            raise InvariantViolation(
                name, f"capture edge max_seq_len={max_seq_len}: {problem}; {where}"
            )
    if not keyword:
        return  # the policy offers no batch-invariant mode
    for max_seq_len in (0, 1, max_model_len):
        with phases.phase("target"):
            width = call_target(
                name, "active_topk_width(..., batch_invariant=True)", target.active_topk_width,
                max_seq_len, compress_ratio, capacity, batch_invariant=True,
            )
        if width != capacity:
            raise InvariantViolation(
                name,
                f"batch-invariant mode (batch_invariant=True): max_seq_len={max_seq_len} "
                f"gets W={width}, expected W = capacity = {capacity}; {where}",
            )
