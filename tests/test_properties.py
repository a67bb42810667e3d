"""One test per invariant of the contract, on the selected target.

Every test runs the contract's historical failures first (``@example``),
then Hypothesis's engine-shaped batches. The checks are the invariants of
:mod:`c128a.invariants`, through the same :data:`c128a.properties.PROPERTIES`
the fuzz runner and the kill matrix use.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, strategies as st

from c128a.batch import Buffers
from c128a.invariants import check_step
from c128a.properties import PROPERTIES
from c128a.pytest_plugin import session_target
from c128a.strategies import HISTORICAL_BATCHES, batches as project_batches, max_model_lens


def batches(**options):
    """Engine batches under the selected target's own width policy, resolved
    at the first draw (the target is loaded after this module is imported)."""
    return st.deferred(lambda: project_batches(session_target(), **options))


def with_history(test):
    """Run the contract's historical failures before any generated batch."""
    for batch in reversed(list(HISTORICAL_BATCHES.values())):
        test = example(batch=batch)(test)
    return test


def run(name, target, batch, device):
    PROPERTIES[name].check(target, batch, device)


@given(batch=batches())
@with_history
def test_matches_oracle(c128a_target, c128a_device, batch):
    run("matches_oracle", c128a_target, batch, c128a_device)


@given(batch=batches(widths="policy", max_tokens=16))
@with_history
def test_adaptive_equals_full(c128a_target, c128a_device, batch):
    run("adaptive_equals_full", c128a_target, batch, c128a_device)


@given(batch=batches())
@with_history
def test_views(c128a_target, c128a_device, batch):
    run("views", c128a_target, batch, c128a_device)


@given(batch=batches())
@with_history
def test_untouched_memory(c128a_target, c128a_device, batch):
    run("untouched_memory", c128a_target, batch, c128a_device)


@given(batch=batches())
@with_history
def test_padding(c128a_target, c128a_device, batch):
    run("padding", c128a_target, batch, c128a_device)


@given(batch=batches())
@with_history
def test_idempotent(c128a_target, c128a_device, batch):
    run("idempotent", c128a_target, batch, c128a_device)


@given(batch=batches())
@with_history
def test_independent(c128a_target, c128a_device, batch):
    run("independent", c128a_target, batch, c128a_device)


@given(batch=batches(min_decode_requests=1))
@with_history
def test_rejects_bad_input(c128a_target, c128a_device, batch):
    if not c128a_target.validates_input:
        pytest.xfail(
            f"target {c128a_target} declares validates_input=False (vLLM checks with assert, "
            "which python -O strips): bad input is not refused with a ValueError"
        )
    run("rejects_bad_input", c128a_target, batch, c128a_device)


@given(batch=batches(max_tokens=0, max_buffer_rows=8))
@with_history
def test_width_policy(c128a_target, c128a_device, batch):
    run("width_policy", c128a_target, batch, c128a_device)


@st.composite
def serving_steps(draw):
    """Two or three steps of one engine: same max_model_len, same buffers."""
    model_len = draw(max_model_lens())
    steps = draw(st.lists(batches(max_model_len=model_len, max_tokens=16), min_size=2, max_size=3))
    return steps


@given(steps=serving_steps())
@example(
    steps=[
        HISTORICAL_BATCHES["upstream_two_decode_two_prefill"],
        HISTORICAL_BATCHES["upstream_rebuilt_at_128"],
    ]
)
def test_check_step_with_persistent_buffers(c128a_target, c128a_device, steps):
    """Each step overwrites only its own region of the previous steps' buffers."""
    rows = max(step.buffer_rows for step in steps)
    buffers = Buffers.allocate(rows, steps[0].capacity, c128a_device)
    for step in steps:
        check_step(c128a_target, step, c128a_device, buffers=buffers)
