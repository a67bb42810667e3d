"""Every property of the contract, on the selected target.

One test per property of :data:`c128a.checks.PROPERTIES`, each running the
property's own Hypothesis test (the same one ``c128a fuzz`` and ``c128a
mutants`` run): the contract's historical failures first (``@example``),
then engine-shaped steps under the loaded profile. A failing step is saved
as a case in pytest's temporary folder (``--basetemp`` chooses it), and
the failure ends with the case file and the ``c128a replay`` line.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, strategies as st

from c128a.checks import PROPERTIES, check_step
from c128a.checks.compile_keys import NOT_KEYED, has_keyed_launchers
from c128a.conformance.saved_failures import FailingSteps, save_failure
from c128a.failures import ContractViolation
from c128a.step import Buffers
from c128a.strategies import HISTORICAL_BATCHES, batches, max_model_lens


# The pipeline and compile-key properties also carry their own markers, so
# that ``-m consumers`` or ``-m compile_keys`` selects them with the rest.
EXTRA_MARKS = {
    "consumers": [pytest.mark.consumers],
    "consumers_replay": [pytest.mark.consumers],
    # A target with no keyed launcher has no compile keys to check: not applicable.
    "compile_keys": [pytest.mark.compile_keys,
                     pytest.mark.applies_to.with_args(has_keyed_launchers, why=NOT_KEYED)],
}


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.conformance(name), *EXTRA_MARKS.get(name, [])])
    for name in PROPERTIES
])
def test_property(c128a_target, c128a_device, name, tmp_path_factory):
    prop = PROPERTIES[name]
    reason = prop.unsupported(c128a_target)
    if reason is not None and name == "rejects_bad_input":
        pytest.xfail(reason)  # the target declares validates_input=False: it fails this
    if reason is not None:
        pytest.skip(reason)  # nothing of it can run on this target: a check that did not run
    failing_steps = FailingSteps()
    try:
        prop.test(c128a_target, c128a_device, around=failing_steps)()
    except ContractViolation as exc:
        batch = failing_steps.step_of(exc)
        if batch is not None:
            folder = tmp_path_factory.getbasetemp() / "c128a-cases"
            folder.mkdir(exist_ok=True)
            exc.add_note(save_failure(exc, batch, name, c128a_target, c128a_device, folder))
        raise


@st.composite
def serving_steps(draw, target):
    """Two or three steps of one engine: same max_model_len, same buffers."""
    model_len = draw(max_model_lens())
    return draw(st.lists(batches(target, max_model_len=model_len, max_tokens=16),
                         min_size=2, max_size=3))


@pytest.fixture(scope="module")
def engine_steps(c128a_target):
    return serving_steps(c128a_target)


@pytest.mark.conformance("persistent_buffers")
def test_check_step_with_persistent_buffers(c128a_target, c128a_device, engine_steps):
    """Each step overwrites only its own region of the previous steps' buffers."""

    @given(steps=engine_steps)
    @example(
        steps=[
            HISTORICAL_BATCHES["upstream_two_decode_two_prefill"],
            HISTORICAL_BATCHES["upstream_rebuilt_at_128"],
        ]
    )
    def steps_overwrite_only_their_region(steps):
        rows = max(step.buffer_rows for step in steps)
        buffers = Buffers.allocate(rows, steps[0].capacity, c128a_device)
        for step in steps:
            check_step(c128a_target, step, c128a_device, buffers=buffers)

    steps_overwrite_only_their_region()
