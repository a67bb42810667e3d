"""The width policy of the selected target: W and C for every step it can see.

``test_width_policy_at_every_model_len`` runs the whole invariant (:func:`c128a.checks.
check_width_policy`); the tests after it state its rules one at a time, at
arbitrary (max_model_len, max_seq_len) points, so a failure names the rule.
"""

from __future__ import annotations

import inspect

import pytest
from hypothesis import assume, example, given, strategies as st

from c128a.checks import CAPTURE_OVERSHOOT, check_width_policy
from c128a.contract.policy import active_topk_width
from c128a.strategies import EDGE_MAX_MODEL_LENS, max_model_lens

pytestmark = pytest.mark.conformance("width_policy")

R = 128
ONE_M = 1_048_576


def with_edge_model_lens(test):
    for model_len in reversed(EDGE_MAX_MODEL_LENS + (1, 127, 128, 129)):
        test = example(max_model_len=model_len)(test)
    return test


@st.composite
def steps(draw):
    """(max_model_len, max_seq_len) with max_seq_len <= max_model_len; lengths
    at and around powers of two times 128 half the time."""
    model_len = draw(max_model_lens())
    near_power = st.integers(0, model_len.bit_length()).flatmap(
        lambda k: st.sampled_from([(1 << k) - 1, 1 << k, (1 << k) + 1])
    )
    seq_len = draw(st.one_of(st.integers(0, model_len), near_power))
    assume(seq_len <= model_len)
    return model_len, seq_len


def width(target, model_len, seq_len):
    return target.active_topk_width(seq_len, R, target.capacity_width(model_len, R))


HISTORY = [
    (ONE_M, ONE_M),  # the 1M edge: W = C = 8192
    (81_920, 81_920),  # capacity 640: W = C, not a power of two
    (200_000, 128 * 128),  # max_seq_len // 128 = 128: W = 128
    (200_000, 129 * 128),  # max_seq_len // 128 = 129: W jumps to 256
    (200_000, 1_024 * 128 + 1),  # a 1,024-column boundary
    (2_048, 0),  # T = 0
]


def with_history(test):
    for step in reversed(HISTORY):
        test = example(step=step)(test)
    return test


@given(max_model_len=max_model_lens())
@with_edge_model_lens
def test_width_policy_at_every_model_len(c128a_target, max_model_len):
    check_width_policy(c128a_target, max_model_len)


@given(step=steps())
@with_history
def test_width_is_multiple_of_128(c128a_target, step):
    assert width(c128a_target, *step) % 128 == 0


@given(step=steps())
@with_history
def test_width_covers_max_seq_len(c128a_target, step):
    model_len, seq_len = step
    assert width(c128a_target, model_len, seq_len) >= seq_len // R


@given(step=steps())
@with_history
def test_width_at_most_capacity(c128a_target, step):
    model_len, seq_len = step
    assert width(c128a_target, model_len, seq_len) <= c128a_target.capacity_width(model_len, R)


@given(step=steps(), shorter=st.integers(0, ONE_M))
@example(step=(200_000, 128 * 128 + 127), shorter=128 * 128 - 1)
@example(step=(ONE_M, ONE_M), shorter=ONE_M - 1)
def test_width_is_monotone(c128a_target, step, shorter):
    model_len, seq_len = step
    shorter = min(shorter, seq_len)
    assert width(c128a_target, model_len, shorter) <= width(c128a_target, model_len, seq_len)


@given(max_model_len=max_model_lens())
@with_edge_model_lens
def test_at_most_log2_distinct_widths(c128a_target, max_model_len):
    capacity = c128a_target.capacity_width(max_model_len, R)
    seen = {
        width(c128a_target, max_model_len, min(needed * R, max_model_len))
        for needed in range(max_model_len // R + 1)
    }
    limit = (capacity // 128).bit_length() - 1 + 2  # floor(log2(C / 128)) + 2
    assert len(seen) <= limit, sorted(seen)


@given(max_model_len=max_model_lens())
@with_edge_model_lens
def test_capacity_is_multiple_of_128(c128a_target, max_model_len):
    capacity = c128a_target.capacity_width(max_model_len, R)
    assert capacity % 128 == 0
    assert capacity * R >= max_model_len - R + 1  # covers max_model_len // R entries


@pytest.mark.parametrize("overshoot", (0,) + CAPTURE_OVERSHOOT)
@pytest.mark.parametrize("max_model_len", [ONE_M, 81_920, 1_000_000])
def test_capture_edge_works_or_raises_clear_error(c128a_target, max_model_len, overshoot):
    """A capture step reaches slightly past max_model_len: the policy returns a
    covering width or refuses with a ValueError, never an assert or a short W."""
    capacity = c128a_target.capacity_width(max_model_len, R)
    seq_len = max_model_len + overshoot
    try:
        chosen = c128a_target.active_topk_width(seq_len, R, capacity)
    except ValueError as exc:
        assert str(exc), "the refusal must say why"
        return
    assert chosen % 128 == 0 and seq_len // R <= chosen <= capacity, chosen


def _batch_invariant_keyword(target) -> bool:
    try:
        return "batch_invariant" in inspect.signature(target.active_topk_width).parameters
    except (TypeError, ValueError):
        return False


# A policy without a batch-invariant mode cannot have this check: not applicable.
@pytest.mark.applies_to.with_args(
    _batch_invariant_keyword,
    why="the target's active_topk_width has no batch_invariant parameter: no "
        "batch-invariant mode")
@given(step=steps())
@with_history
def test_batch_invariant_mode_pins_width_to_capacity(c128a_target, step):
    model_len, seq_len = step
    capacity = c128a_target.capacity_width(model_len, R)
    chosen = c128a_target.active_topk_width(seq_len, R, capacity, batch_invariant=True)
    assert chosen == capacity


def uses_project_width(target) -> bool:
    """Whether the target's W comes from the project's policy, whatever else
    it brings (a module importing capacity_width brings that alone)."""
    return target.active_topk_width is active_topk_width


# A check of the project's policy: not of a target that brings its own.
# (with_args: a lone function argument would be taken for the decorated test.)
@pytest.mark.applies_to.with_args(
    uses_project_width, why="the target brings its own width policy (this is a check of the "
    "project's)")
def test_batch_invariant_mode_follows_environment(c128a_target, monkeypatch):
    """vLLM's VLLM_BATCH_INVARIANT switches the project's policy to W = C."""
    capacity = c128a_target.capacity_width(ONE_M, R)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert c128a_target.active_topk_width(200, R, capacity) == capacity
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    assert c128a_target.active_topk_width(200, R, capacity) == 128
