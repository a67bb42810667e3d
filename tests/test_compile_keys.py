"""Every launch's compile key among those its warm-up compiles (marker ``compile_keys``).

On the CPU, the check can fail and says what it found: a released vLLM's
known finding is still found, readable, and saved as a case that replays;
the stride-blind launcher is killed and the correctly keyed one survives.
(The check itself runs on the selected target in ``c128a/conformance/``:
the ``compile_keys`` property and every step of the serving-loop machine.) (The GPU side, counting compiled variants, is
``tests/test_recompile.py``.)
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from c128a.cases import load_case, new_case, write_case
from c128a.checks import PROPERTIES
from c128a.conformance.saved_failures import FailingSteps
from c128a.failures import InvariantViolation
from c128a.replay import COMPILE_KEYS_SETTINGS, compile_keys_machine
from c128a.runners.killmatrix import ci_settings, run_property
from c128a.targets import load_target

pytestmark = pytest.mark.compile_keys

KEYED = "c128a.kernels.keyed:target"
STRIDE_BLIND = "c128a.mutants:stride_blind_keys"
KNOWN_FINDINGS = {
    version: ("consumer global_topk", "ComputeGlobalTopkIndicesAndLensKernel",
              "topk_indices_stride")
    for version in ("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
}
"""vLLM release -> (who launches, the kernel, the parameter) of the miss the
check finds there (docs/explanation/compile-keys.md,
"Findings in released vLLM")."""


def _release(target) -> str | None:
    spec = str(target.spec)
    return spec.removeprefix("vllm-release:") if spec.startswith("vllm-release:") else None


def test_known_finding_is_still_found(c128a_target, c128a_device, tmp_path):
    """The release's miss: named (who, kernel, parameter, warmed values,
    step), saved as a case, and the case replays to the same failure."""
    release = _release(c128a_target)
    if release not in KNOWN_FINDINGS:
        pytest.skip(f"no known compile-key finding for target {c128a_target}")
    who, kernel, parameter = KNOWN_FINDINGS[release]
    prop = PROPERTIES["compile_keys"]
    failing = FailingSteps()
    with pytest.raises(InvariantViolation) as raised:
        prop.test(c128a_target, c128a_device, settings=ci_settings(20), around=failing)()
    batch, message = failing.step_of(raised.value), str(raised.value)
    assert batch is not None, message
    for part in (who, kernel, parameter, "is warmed only with", "W=", "capacity="):
        assert part in message, (part, message)
    path, _ = write_case(new_case(property="compile_keys", target=str(c128a_target.spec),
                                  kind="failure", failure=message, batch=batch,
                                  device=str(c128a_device)), tmp_path)
    case = load_case(path)
    with pytest.raises(InvariantViolation, match=parameter):
        prop.replay(c128a_target, case.batch, c128a_device)


def test_known_finding_shows_in_the_serving_loop(c128a_target, c128a_device):
    release = _release(c128a_target)
    if release not in KNOWN_FINDINGS:
        pytest.skip(f"no known compile-key finding for target {c128a_target}")
    saved = []
    with pytest.raises(InvariantViolation):
        run_state_machine_as_test(compile_keys_machine(c128a_target, c128a_device, saved),
                                  settings=COMPILE_KEYS_SETTINGS)
    assert "; step: [" in saved[-1][1] and "step " in saved[-1][1], saved[-1][1]


def test_stride_blind_launcher_is_killed(c128a_device):
    outcome = run_property(PROPERTIES["compile_keys"], load_target(STRIDE_BLIND), c128a_device,
                           ci_settings(10))
    assert outcome.killed, outcome.cell()
    assert "DECODE_STRIDE = constexpr" in outcome.message, outcome.message


@pytest.mark.parametrize("spec", [KEYED, "triton", "triton-inert"])
def test_keyed_target_survives(c128a_device, spec):
    outcome = run_property(PROPERTIES["compile_keys"], load_target(spec), c128a_device,
                           ci_settings(25))
    assert not outcome.killed and not outcome.errored and not outcome.unsupported, outcome.message


def test_stride_blind_launcher_is_killed_in_the_serving_loop(c128a_device):
    saved = []
    with pytest.raises(InvariantViolation):
        run_state_machine_as_test(compile_keys_machine(load_target(STRIDE_BLIND), c128a_device, saved),
                                  settings=COMPILE_KEYS_SETTINGS)
    batch, message = saved[-1]
    assert "DECODE_STRIDE" in message and "; step: [" in message, message


def test_keyed_target_survives_the_serving_loop(c128a_device):
    run_state_machine_as_test(compile_keys_machine(load_target(KEYED), c128a_device),
                              settings=COMPILE_KEYS_SETTINGS)


def test_a_target_without_keyed_launchers_is_named(c128a_device):
    reason = PROPERTIES["compile_keys"].unsupported(load_target("reference"))
    assert reason is not None and "keyed launcher" in reason


NEVER_LAUNCHED = "c128a.mutants:launcher_never_launched"


def test_a_declared_launcher_never_launched_through_fails_not_passes(c128a_device):
    """A target declaring a keyed launcher whose build never launches
    through it (here: it builds with torch) compared no key: before, both
    checks passed, having checked nothing."""
    target = load_target(NEVER_LAUNCHED)
    outcome = run_property(PROPERTIES["compile_keys"], target, c128a_device, ci_settings(10))
    assert outcome.killed, outcome.cell()
    assert ("declares keyed launcher(s) KeyedBuildKernel for its build, but building this step"
            in outcome.message and "no compile key of it was compared" in outcome.message), (
        outcome.message)
    saved = []
    with pytest.raises(InvariantViolation, match="launched through none of them"):
        run_state_machine_as_test(compile_keys_machine(target, c128a_device, saved),
                                  settings=COMPILE_KEYS_SETTINGS)
    assert "; step: [" in saved[-1][1], saved[-1][1]
