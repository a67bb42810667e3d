"""What a target hands the consumers of its views, and the compile keys of
every step of a serving loop (markers ``consumers`` and ``compile_keys``).

The ``consumers``, ``consumers_replay`` and ``compile_keys`` properties run
in ``test_properties.py`` with the others; here: each consumer an engine runs
on the views is one the target provides (a release lacking one skips,
naming it), and every step of the serving-loop machine launches with keys
its launchers' warm-up compiles.
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from c128a.checks.compile_keys import NOT_KEYED, has_keyed_launchers
from c128a.checks.consumers import consumers_of
from c128a.replay import COMPILE_KEYS_SETTINGS, compile_keys_machine
from c128a.step.consumer_inputs import CONSUMER_NAMES


@pytest.mark.consumers
@pytest.mark.conformance("consumers")
@pytest.mark.parametrize("name", CONSUMER_NAMES)
def test_target_has_consumer(c128a_target, name):
    gaps = dict(getattr(c128a_target, "consumer_gaps", ()))
    if name in gaps:
        pytest.skip(f"{c128a_target}: consumer {name} unavailable: {gaps[name]}")
    assert name in [c.name for c in consumers_of(c128a_target)]


@pytest.mark.compile_keys
@pytest.mark.conformance("compile_keys")
@pytest.mark.applies_to.with_args(has_keyed_launchers, why=NOT_KEYED)
def test_compile_keys_over_the_serving_loop(c128a_target, c128a_device):
    run_state_machine_as_test(compile_keys_machine(c128a_target, c128a_device),
                              settings=COMPILE_KEYS_SETTINGS)
