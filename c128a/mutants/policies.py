"""Width-policy faults: the oracle's builder under a broken width or capacity."""

from __future__ import annotations

from ..contract import COMPRESS_RATIO, WIDTH_ALIGNMENT, policy
from .registry import policy_mutant


def _width_without_floor(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    needed = max(max_seq_len // compress_ratio, 1)
    return min(policy.next_power_of_2(needed), capacity)


def _width_undercovers(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    # Off by one: the entries of the last position, (max_seq_len - 1) // R.
    needed = max((max_seq_len - 1) // compress_ratio, 1)
    return min(max(policy.next_power_of_2(needed), WIDTH_ALIGNMENT), capacity)


def _unaligned_capacity(max_model_len, compress_ratio=COMPRESS_RATIO):
    return -(-max_model_len // compress_ratio)


def _width_for_any_capacity(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    needed = max(max_seq_len // compress_ratio, 1)
    return min(max(policy.next_power_of_2(needed), WIDTH_ALIGNMENT), capacity)


def _ignores_batch_invariant(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    return policy.active_topk_width(max_seq_len, compress_ratio, capacity, batch_invariant=False)


def _asserts_at_capture_edge(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    needed = max_seq_len // compress_ratio
    width = min(max(policy.next_power_of_2(max(needed, 1)), WIDTH_ALIGNMENT), capacity)
    if batch_invariant is None:
        batch_invariant = policy.batch_invariant_from_env()
    if batch_invariant:
        width = capacity
    assert width >= needed, f"W={width} < {needed}"  # the fault: an assert, not a ValueError
    return width


def _clamps_at_capture_edge(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    # Silently caps at the capacity instead of refusing: cuts the lists.
    clamped = min(max_seq_len, capacity * compress_ratio)
    return policy.active_topk_width(
        clamped, compress_ratio, capacity, batch_invariant=batch_invariant
    )


policy_mutant(
    "width_without_floor",
    "W = min(next_power_of_2(max_seq_len // R), C) without the 128 floor: widths 1..64",
    "unaligned width",
    ("width_policy",),
    active_topk_width=_width_without_floor,
)
policy_mutant(
    "width_undercovers",
    "W from (max_seq_len - 1) // R: one entry short when max_seq_len // R is a power of "
    "two plus one, cutting the longest token's list",
    "capture at the edge",
    ("width_policy",),
    active_topk_width=_width_undercovers,
)
policy_mutant(
    "unaligned_capacity",
    "C = ceil(max_model_len / R), not rounded up to a multiple of 128",
    "unaligned width",
    ("width_policy",),
    active_topk_width=_width_for_any_capacity,
    capacity_width=_unaligned_capacity,
)
policy_mutant(
    "ignores_batch_invariant",
    "the policy follows max_seq_len even in batch-invariant mode (VLLM_BATCH_INVARIANT), "
    "so a token's output depends on its neighbours",
    "batch-dependent width",
    ("width_policy",),
    active_topk_width=_ignores_batch_invariant,
)
policy_mutant(
    "asserts_at_capture_edge",
    "a capture step past the capacity's reach fails an assert (AssertionError) instead "
    "of the policy's clear ValueError",
    "capture at the edge",
    ("width_policy",),
    active_topk_width=_asserts_at_capture_edge,
)
policy_mutant(
    "clamps_at_capture_edge",
    "a capture step past the capacity's reach silently gets W = C, shorter than "
    "max_seq_len // R, instead of a clear refusal",
    "capture at the edge",
    ("width_policy",),
    active_topk_width=_clamps_at_capture_edge,
)


def _width_assumes_ratio_128(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    # The argument checks, the capture edge's refusal and batch-invariant
    # mode as the contract's policy has them; else the engine's R where the
    # argument should be.
    width = policy.active_topk_width(max_seq_len, compress_ratio, capacity,
                                     batch_invariant=batch_invariant)
    if batch_invariant or (batch_invariant is None and policy.batch_invariant_from_env()):
        return width
    needed = max(max_seq_len // COMPRESS_RATIO, 1)
    return min(max(policy.next_power_of_2(needed), WIDTH_ALIGNMENT), capacity)


def _capacity_rounds_down(max_model_len, compress_ratio=COMPRESS_RATIO):
    # floor(L / R) entries: one short when R does not divide L.
    entries = max(max_model_len // compress_ratio, 1)
    return -(-entries // WIDTH_ALIGNMENT) * WIDTH_ALIGNMENT


policy_mutant(
    "width_assumes_ratio_128",
    "W computed from max_seq_len // 128 whatever the compress ratio it is given (and "
    "capped at C): right at the engine's R = 128 only",
    "R and B hard-coded",
    ("width_policy",),
    active_topk_width=_width_assumes_ratio_128,
)
policy_mutant(
    "capacity_rounds_down",
    "C from floor(max_model_len / R) entries, not ceil: one 128-column tile short when R "
    "does not divide max_model_len and the floor is a multiple of 128",
    "capture at the edge",
    ("width_policy",),
    capacity_width=_capacity_rounds_down,
)
