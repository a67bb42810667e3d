"""The serving-loop state machine catches the replay mutants, and its
opt-in stale-sentinel check trips for a correct target.

The machine on the selected target is :mod:`c128a.conformance.test_serving_loop`.
Runs under the loaded Hypothesis profile (ci: derandomized, 25 runs of up
to 50 steps) without its shrink phase: what each test asserts is in the
first failing run as well, and shrinking it was most of these tests' time.
Every test here replays captured consumers, so every test is marked
``graph``.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from c128a.failures import ReplayMismatch, StaleSentinelHazard
from c128a.replay import build_machine, serving_loop_machine
from c128a.targets import load_target

pytestmark = [pytest.mark.graph, pytest.mark.slow]  # each runs the machine for many steps

PACKED = "c128a.mutants:packed_stride"
SPILL = "c128a.mutants:spill_past_width"


def failing_run(machine) -> AssertionError:
    """Run ``machine`` expecting a failure; return the first one, unshrunk."""
    unshrunk = settings(settings.default, phases=[p for p in settings.default.phases
                                                  if p is not Phase.shrink])
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine, settings=unshrunk)
    return failure.value


def steps_of(failure: BaseException) -> str:
    """The failing example as Hypothesis printed it (the step list)."""
    return "\n".join(getattr(failure, "__notes__", []))


def test_packed_stride_mutant_is_killed(c128a_device):
    failure = failing_run(serving_loop_machine(load_target(PACKED), c128a_device))
    assert "state.add_request(" in steps_of(failure)


def test_packed_stride_mutant_is_killed_by_replay_alone(c128a_device):
    """Without the one-build invariants and the window check, the consumer's
    output alone catches it: decode row 1 onward is read from stale bytes."""
    machine = build_machine(
        load_target(PACKED), c128a_device, check_invariants=False, check_window=False
    )
    failure = failing_run(machine)
    assert isinstance(failure, ReplayMismatch)
    assert (failure.kind, failure.section) == ("output", "decode") and failure.row >= 1
    steps = steps_of(failure)
    assert "requests_0 = state.add_request(" in steps


def test_spill_past_width_mutant_is_killed(c128a_device):
    failure = failing_run(serving_loop_machine(load_target(SPILL), c128a_device))
    assert "state.add_request(" in steps_of(failure)


def test_spill_past_width_mutant_is_killed_by_replay_alone(c128a_device):
    machine = build_machine(load_target(SPILL), c128a_device, check_invariants=False)
    failure = failing_run(machine)
    assert isinstance(failure, ReplayMismatch) and failure.kind == "window"


def test_strict_sentinels_trip_for_a_correct_target(c128a_device):
    """The documented hazard is real for a correct target: with the opt-in check,
    the machine finds a row exactly W long with stale indices in [W, W_capture)."""
    machine = serving_loop_machine(load_target("reference"), c128a_device, strict_sentinels=True)
    failure = failing_run(machine)
    assert isinstance(failure, StaleSentinelHazard)
    assert "which this step did not write; stale indices there" in str(failure)
    assert "state.add_request(" in steps_of(failure)


