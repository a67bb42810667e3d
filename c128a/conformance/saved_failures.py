"""A property's failing step, saved as a case: what a failed conformance
test prints below the diff is the case file and the ``c128a replay`` line
that reruns it without Hypothesis or pytest."""

from __future__ import annotations

from pathlib import Path

from c128a import cases
from c128a.failures import ContractViolation, failure_text
from c128a.step import Batch


class FailingSteps:
    """``around`` for :meth:`c128a.checks.Property.test`: remembers the step
    each contract violation was raised on (Hypothesis raises the one of the
    example it reports, shrunk or explicit)."""

    def __init__(self) -> None:
        self._raised: dict[int, tuple[BaseException, Batch]] = {}

    def __call__(self, batch: Batch, run) -> None:
        try:
            run()
        except ContractViolation as exc:
            self._raised[id(exc)] = (exc, batch)
            raise

    def step_of(self, exc: BaseException) -> Batch | None:
        """The step ``exc`` (or, for several failures, the first of them
        that has one) was raised on."""
        for candidate in [exc, *getattr(exc, "exceptions", ())]:
            raised = self._raised.get(id(candidate))
            if raised is not None and raised[0] is candidate:
                return raised[1]
        return None


def save_failure(exc: BaseException, batch: Batch, name: str, target, device, folder: Path) -> str:
    """Save the failure of property ``name`` on ``batch`` as a case in
    ``folder``; return the lines that name the file and rerun it."""
    case = cases.new_case(
        property=name,
        target=target.spec,
        kind="failure",
        failure=failure_text(exc),
        batch=batch,
        device=device.type,
        outside_contract=cases.contract_breach(batch, target.padding_rows),
        padding_rows=target.padding_rows,
    )
    path, _ = cases.write_case(case, folder)
    return (f"case file: {path}\n"
            f"rerun: c128a replay {path} --target {target.spec} --device {device.type}")
