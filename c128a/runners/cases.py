"""Failure cases: self-describing JSON files, and replaying them.

A case holds everything needed to rerun one failure without Hypothesis: the
property, the target it failed on, the concrete inputs (a
:class:`~c128a.step.Batch` as plain lists), plus the seed, Hypothesis's
reproduce blob, versions and the failure message for the reader. JSON only,
never pickle: a case is read by people and checked into ``tests/regressions``.
Its schema is the :class:`Case` dataclass itself (:mod:`c128a.step.schema`).

Kinds: ``failure`` (a property's check raised; the shrunk example),
``crash`` and ``hang`` (the input a fuzz worker was running when it died or
stopped answering), ``serving_loop`` (a failure of the stateful serving-loop
machine: its step list and reproduce blob, no concrete batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hypothesis import __version__ as HYPOTHESIS_VERSION
from hypothesis import reproduce_failure, settings
from hypothesis.errors import DidNotReproduce
from hypothesis.stateful import run_state_machine_as_test

from ..failures import BadArgument, CaseError, failure_text, is_kill
from ..step import Batch
from ..step.schema import from_json
from ..targets import import_object

CASE_FORMAT = "c128a-case/1"
KINDS = ("failure", "crash", "hang", "serving_loop")
SERVING_LOOP = "serving_loop"
DEFAULT_CASES_DIR = "tests/regressions"
DEFAULT_PROPERTIES = "c128a.checks:PROPERTIES"
DEFAULT_MACHINE = "c128a.replay:serving_loop_machine"
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
    steps: str | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    created: str = ""
    path: Path | None = dataclasses.field(default=None, compare=False, metadata={"json": False})

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": CASE_FORMAT}
        for spec in dataclasses.fields(self):
            if spec.metadata.get("json", True):
                data[spec.name] = getattr(self, spec.name)
        data["batch"] = self.batch.to_json() if self.batch is not None else None
        data["versions"] = dict(self.versions)
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
        if case.kind == "failure" and case.batch is None:
            raise CaseError(path, "batch", "missing: a failure case needs its concrete inputs")
        if case.kind == SERVING_LOOP and not (case.reproduce_blob or case.steps):
            raise CaseError(path, "steps", "a serving_loop case needs its steps or reproduce_blob")
        return dataclasses.replace(case, path=Path(path) if path is not None else None)


def _read_batch(value: Any, path, where: str) -> Batch | None:
    if value is None:
        return None
    batch = Batch.from_json(value, path, where)
    try:
        batch.validate()
    except BadArgument as exc:
        raise CaseError(path, where, f"outside the contract: {exc}") from exc
    return batch


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


def case_identity(case: Case) -> str:
    """A short hash of what makes the failure: property and inputs (not the message)."""
    if case.batch is not None:
        inputs: Any = case.batch.to_json()
        inputs.pop("labels", None)  # labels describe the batch; they are not inputs
    else:
        inputs = {"steps": case.steps, "blob": case.reproduce_blob, "kind": case.kind}
    text = json.dumps([case.property, inputs], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def case_filename(case: Case) -> str:
    return f"{case.property}-{case_identity(case)}.json"


def readable_json(data: Any, indent: str = "") -> str:
    """JSON with one object key per line and every list on one line (short diffs)."""
    if isinstance(data, dict) and data:
        inner = indent + "  "
        items = [f"{inner}{json.dumps(k)}: {readable_json(v, inner)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    return json.dumps(data)


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` so that a reader (or a crash) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(readable_json(data))
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_case(case: Case, cases_dir: Path | str) -> tuple[Path, bool]:
    """Save ``case`` in ``cases_dir``: (path, True) or, when the same failure
    is already saved there, (its path, False) and nothing is written."""
    path = Path(cases_dir) / case_filename(case)
    if path.exists():
        return path, False
    atomic_write_json(path, case.to_json())
    return path, True


def load_case(path: Path | str) -> Case:
    """Read and validate one case file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CaseError(path, "<file>", f"cannot read: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaseError(path, "<file>", f"not JSON: {exc}") from exc
    return Case.from_json(data, path)


def case_files(cases_dir: Path | str) -> list[Path]:
    """Every ``*.json`` case in ``cases_dir``, sorted (stable test ids)."""
    return sorted(Path(cases_dir).glob("*.json"))


# ---------------------------------------------------------------- replay


PASSES, FAILS, CANNOT_REPLAY = "passes", "still fails", "cannot replay"


@dataclass(frozen=True)
class Outcome:
    """A replay's verdict: :data:`PASSES` (exit 0), :data:`FAILS` (the target
    still breaks the contract, exit 1) or :data:`CANNOT_REPLAY` (this
    installation cannot rerun it, or the suite itself failed; exit 2)."""

    verdict: str
    report: str

    @property
    def passed(self) -> bool:
        return self.verdict == PASSES

    @property
    def replayable(self) -> bool:
        return self.verdict != CANNOT_REPLAY


def _verdict_of(exc: BaseException, report: str) -> Outcome:
    if is_kill(exc):
        return Outcome(FAILS, report)
    return Outcome(CANNOT_REPLAY, f"the suite itself failed replaying the case: {report}")


def step_calls(text: str | None) -> list[str]:
    """The machine's rule calls in Hypothesis's printed steps, without result names."""
    calls = []
    for line in (text or "").splitlines():
        line = line.strip()
        if "state." in line:
            calls.append(re.sub(r"^[\w, ]+ = (?=state\.)", "", line))
    return calls


def describe_batch(batch: Batch) -> str:
    return (
        f"T={batch.num_tokens} (decode {batch.num_decode_tokens}, prefill "
        f"{batch.num_prefill_tokens}), W={batch.width}, capacity={batch.capacity}, "
        f"max_model_len={batch.max_model_len}, block table {len(batch.block_table)}x"
        f"{batch.table_width} (row stride {max(batch.block_table_row_stride, batch.table_width)})"
    )


def replay_machine(case: Case, target, device, machine_factory) -> Outcome:
    """Rerun a serving-loop failure from its reproduce blob."""
    installed = HYPOTHESIS_VERSION
    recorded = case.versions.get("hypothesis")
    if not case.reproduce_blob:
        return Outcome(CANNOT_REPLAY, "the case has no reproduce_blob; steps were:\n"
                       f"{case.steps}")
    if recorded and recorded != installed:
        return Outcome(
            CANNOT_REPLAY,
            f"the blob is from hypothesis {recorded}, installed is {installed}; "
            f"the recorded steps were:\n{case.steps}",
        )
    machine = machine_factory(target, device)
    pinned = type(machine.__name__, (machine,), {})
    reproduce_failure(installed, case.reproduce_blob.encode())(pinned)
    printed = io.StringIO()  # Hypothesis prints the steps as it replays them
    try:
        with contextlib.redirect_stdout(printed):
            run_state_machine_as_test(pinned, settings=settings(database=None, deadline=None))
    except DidNotReproduce:
        pass
    except Exception as exc:  # noqa: BLE001 - any error is the failure being replayed
        steps = "\n".join(n for n in getattr(exc, "__notes__", ()) if "reproduce_failure" not in n)
        return _verdict_of(exc, f"{failure_text(exc)}\n{steps or printed.getvalue()}".rstrip())
    replayed, recorded_calls = step_calls(printed.getvalue()), step_calls(case.steps)
    if recorded_calls and replayed != recorded_calls:
        # The blob encodes choices, not steps: after a change to the machine it
        # may drive different steps, and a pass would prove nothing.
        return Outcome(
            CANNOT_REPLAY,
            "the blob now drives different steps (the machine changed); "
            f"recorded:\n{case.steps}\nreplayed:\n{printed.getvalue()}",
        )
    return Outcome(PASSES, "the recorded step sequence no longer fails")


def replay_case(case: Case, target, device, *, properties=None, machine_factory=None) -> Outcome:
    """Run the case's check on ``target``: passes, or the failure's readable diff."""
    device = torch.device(device)
    if case.kind == SERVING_LOOP:
        if machine_factory is None:
            machine_factory = import_object(DEFAULT_MACHINE)
        return replay_machine(case, target, device, machine_factory)
    if properties is None:
        properties = import_object(DEFAULT_PROPERTIES)
    prop = properties.get(case.property)
    if prop is None:
        raise CaseError(
            case.path,
            "property",
            f"{case.property!r} is not a known property (known: {', '.join(sorted(properties))})",
        )
    if case.batch is None:
        return Outcome(CANNOT_REPLAY, f"this {case.kind} case has no concrete inputs")
    try:
        prop.replay(target, case.batch, device)
    except Exception as exc:  # noqa: BLE001 - any error is the failure being replayed
        return _verdict_of(exc, failure_text(exc))
    return Outcome(PASSES, "the check passes")
