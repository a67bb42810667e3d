"""Bad input is refused with a ValueError naming the argument, and nothing is written.

One test per bad input (:data:`c128a.checks.BAD_INPUTS`), on the
selected target. A target that declares ``validates_input=False`` (vLLM,
which checks with ``assert``) reports each as an expected failure, never a
pass. A third-party target is only obliged to check the contract's own
preconditions (W % 128 == 0, 0 < W <= the buffers' widths, last stride 1):
the project's extra checks are not checks of it and are deselected for it
(``applies_to``; a skip would read as a check that did not run).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given

from c128a.checks import BAD_INPUTS, check_rejects_bad_input
from c128a.targets import is_project_target
from c128a.strategies import HISTORICAL_BATCHES, batches

EXAMPLES = [
    HISTORICAL_BATCHES[name]
    for name in (
        "upstream_two_decode_two_prefill",
        "capacity_8192_at_1m",
        "speculative_decode_8_tokens",
        "padding_tail_and_inside",
    )
]


@pytest.mark.conformance("rejects_bad_input")
@pytest.mark.parametrize("case", [
    # The project's own checks oblige only the project's targets.
    pytest.param(case, id=case.name,
                 marks=[] if case.contract else [pytest.mark.applies_to.with_args(
                     is_project_target, why="a check of the project's own builders, which the "
                     "contract does not ask of others")])
    for case in BAD_INPUTS
])
def test_rejects(c128a_target, c128a_device, case):
    if not c128a_target.validates_input:
        pytest.xfail(
            f"target {c128a_target} declares validates_input=False (vLLM checks with assert, "
            "which python -O strips): bad input is not refused with a ValueError"
        )

    @given(batch=batches(min_decode_requests=1, max_tokens=16))
    def rejects(batch):
        assume(case.applies(batch))
        check_rejects_bad_input(c128a_target, batch, c128a_device, cases=[case])

    for batch in reversed(EXAMPLES):
        rejects = example(batch=batch)(rejects)
    rejects()
