"""The serving-loop state machine on the selected target: every step built,
checked and replayed (:func:`c128a.replay.serving_loop_machine`).

Runs under the loaded Hypothesis profile (ci: derandomized, 25 runs of up
to 50 steps); a shrunk failure prints as the list of steps.
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from c128a.replay import serving_loop_machine

# It replays captured consumers for many steps.
pytestmark = [pytest.mark.graph, pytest.mark.slow, pytest.mark.conformance("serving_loop")]


def test_serving_loop_passes(c128a_target, c128a_device, c128a_strict_sentinels):
    machine = serving_loop_machine(
        c128a_target, c128a_device, strict_sentinels=c128a_strict_sentinels
    )
    run_state_machine_as_test(machine)
