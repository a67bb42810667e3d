"""The case format: one failure as a self-describing JSON object.

A case holds everything needed to rerun one failure without Hypothesis: the
property, the target it failed on and the padding-row variant it was held
to, the concrete inputs (a :class:`~c128a.step.Batch` as plain lists), plus
the seed, Hypothesis's reproduce blob, versions and the failure message for
the reader. JSON only, never pickle: a case is read by people and checked
into a cases folder (the kept ones: ``c128a/conformance/regressions``).
Its schema is the :class:`Case` dataclass itself (:mod:`c128a.step.schema`).

Kinds: ``failure`` (a property's check raised; the shrunk example, or the
first failing one when shrinking was cut short), ``crash`` and ``hang`` (the
input a fuzz worker was running when it died or stopped answering),
``serving_loop`` (a failure of the stateful serving-loop machine: the
engine steps it built, each a concrete batch, in ``machine_steps``, its
printed step list and its reproduce blob; no single batch). A case whose inputs break the
contract's preconditions (the target's own policy chose them) says so in
``outside_contract``, which excuses the width and capacity only; any other
case must hold inputs inside the contract.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from ..contract import DEFAULT_PADDING_ROWS, WIDTH_ALIGNMENT, PaddingRows
from ..failures import BadArgument, CaseError
from ..replay.recorded import MachineSteps
from ..step import Batch
from ..step.schema import INT32, Range, from_json, to_json

CASE_FORMAT = "c128a-case/1"
KINDS = ("failure", "crash", "hang", "serving_loop")
SERVING_LOOP = "serving_loop"
VERSIONED_PACKAGES = ("c128a", "torch", "triton", "hypothesis")


def versions() -> dict[str, str]:
    """Versions of what decided the outcome (read from metadata: imports nothing)."""
    found = {}
    for name in VERSIONED_PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["python"] = platform.python_version()
    return found


@dataclass(frozen=True)
class Case:
    """One saved failure. Each field's annotation is its JSON schema."""

    property: str
    target: str
    kind: str
    failure: str
    batch: Batch | None = None
    device: str | None = None
    seed: int | None = None
    reproduce_blob: str | None = None
    steps: str | None = None  # the machine's steps as Hypothesis printed them, for the reader
    # The engine steps a serving-loop failure built, replayable without Hypothesis.
    machine_steps: MachineSteps | None = None
    # A hash of machine_steps as written (:func:`machine_steps_digest`): an
    # edited step or engine no longer matches it, and the case is refused.
    machine_steps_digest: str | None = None
    outside_contract: str | None = None  # why the inputs break the contract's preconditions
    # A serving-loop round's size: replayable from its seed.
    round_examples: Annotated[int, Range(1, INT32.high)] | None = None
    profile: str | None = None  # the Hypothesis profile the round ran under
    # The padding-row variant the target was held to (None: recorded before
    # variants existed, so the replay target's own declaration).
    padding_rows: PaddingRows | None = None
    # What compute-sanitizer printed for a sanitizer case's build (c128a sanitize).
    sanitizer_report: str | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    created: str = ""
    path: Path | None = dataclasses.field(default=None, compare=False, metadata={"json": False})

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": CASE_FORMAT}
        for spec in dataclasses.fields(self):
            if spec.metadata.get("json", True):
                data[spec.name] = to_json(getattr(self, spec.name))
        return data

    @classmethod
    def from_json(cls, data: Any, path=None) -> "Case":
        """Validate a case's JSON; :class:`~c128a.failures.CaseError` names the
        first bad field and the rule."""
        if not isinstance(data, dict):
            raise CaseError(path, "<top level>", f"must be a JSON object, got {type(data).__name__}")
        if data.get("format") != CASE_FORMAT:
            raise CaseError(path, "format", f"must be {CASE_FORMAT!r}, got {data.get('format')!r}")
        fields = {k: v for k, v in data.items() if k != "format"}
        case = from_json(cls, fields, path, "", {"batch": _read_batch})
        for name in ("property", "target", "kind"):
            if not getattr(case, name):
                raise CaseError(path, name, "must be a non-empty string")
        if case.kind not in KINDS:
            raise CaseError(path, "kind", f"must be one of {', '.join(KINDS)}, got {case.kind!r}")
        if case.batch is not None and case.outside_contract is None:
            reason = contract_breach(case.batch, case.padding_rows)
            if reason is not None:
                raise CaseError(path, "batch", f"outside the contract: {reason}")
        if case.batch is not None and case.outside_contract is not None:
            # outside_contract excuses what a target's own policy chose, the
            # width and capacity; inputs malformed in any other way are not
            # a failure to replay.
            reason = breach_beside_widths(case.batch, case.padding_rows)
            if reason is not None:
                raise CaseError(
                    path, "batch", f"outside the contract in more than its width and capacity "
                    f"(which outside_contract excuses): {reason}"
                )
        for index, step in enumerate(case.machine_steps.steps if case.machine_steps else ()):
            # Replay builds each step at the replay target's own widths, so
            # only the rest of a step must be inside the contract.
            reason = breach_beside_widths(step.batch, case.padding_rows)
            if reason is not None:
                raise CaseError(path, f"machine_steps.steps[{index}].batch",
                                f"outside the contract: {reason}")
        if case.kind == "failure" and case.batch is None and not case.reproduce_blob:
            raise CaseError(
                path, "batch", "missing: a failure case needs its concrete inputs or its "
                "reproduce_blob"
            )
        if case.kind == SERVING_LOOP and not (
            case.reproduce_blob or case.steps or case.machine_steps
        ):
            raise CaseError(path, "steps", "a serving_loop case needs its machine_steps, steps "
                            "or reproduce_blob")
        # Last: a step malformed or outside the contract is named as such above.
        _check_steps_digest(case, data.get("machine_steps"), path)
        return dataclasses.replace(case, path=Path(path) if path is not None else None)


def _read_batch(value: Any, path, where: str) -> Batch | None:
    return None if value is None else Batch.from_json(value, path, where)


def machine_steps_digest(recorded: Any) -> str:
    """A hash of a serving-loop case's ``machine_steps`` as JSON data (as
    written, whatever its layout): its engine and every step."""
    text = json.dumps(recorded, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_steps_digest(case: Case, recorded: Any, path) -> None:
    """The case's ``machine_steps``, as the file holds them, are those it
    was written with: an edited step or engine replays something else than
    the failure the case records (its message, printed steps and blob), so
    such a case is refused rather than replayed. A case without a digest
    (written before there was one) is read as it is, and so is one without
    its steps, which replays from its blob as a case written before steps
    were recorded (the blob drives the machine's own steps, checked against
    the printed ones)."""
    if case.machine_steps_digest is None or case.machine_steps is None:
        return
    found = machine_steps_digest(recorded)
    if found != case.machine_steps_digest:
        raise CaseError(
            path, "machine_steps", f"changed since the case was written (they hash to {found}, "
            f"machine_steps_digest={case.machine_steps_digest}): the steps or the engine were "
            "edited, so they no longer hold the failure the case records; restore them from "
            "the file's history, or, to replay the edited steps as a case of their own, remove "
            "machine_steps_digest"
        )


def contract_breach(batch: Batch, padding_rows: str | None = None) -> str | None:
    """Why ``batch``, as the builder's arguments, breaks the contract's
    preconditions under the ``padding_rows`` variant (None: the default);
    None when it is inside the contract."""
    try:
        batch.validate(padding_rows or DEFAULT_PADDING_ROWS)
    except BadArgument as exc:
        return str(exc)
    return None


def breach_beside_widths(batch: Batch, padding_rows: str | None = None) -> str | None:
    """Why ``batch`` breaks the contract in anything other than its width and
    capacity, which a target's own policy chooses (an outside-contract
    case's excuse): checked at the smallest valid width, on buffers with the
    capacity rounded up to a valid one. None when only those two break it."""
    capacity = max(-(-batch.capacity // WIDTH_ALIGNMENT) * WIDTH_ALIGNMENT, WIDTH_ALIGNMENT)
    return contract_breach(
        dataclasses.replace(batch, capacity=capacity, width=WIDTH_ALIGNMENT), padding_rows
    )


def new_case(*, property: str, target: str, kind: str, failure: str, **fields) -> Case:
    """A case stamped with the current versions and time."""
    if kind not in KINDS:
        raise CaseError(None, "kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    return Case(
        property=property,
        target=target,
        kind=kind,
        failure=failure,
        versions=versions(),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **fields,
    )
