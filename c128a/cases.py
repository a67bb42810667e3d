"""Failure cases: self-describing JSON files, and ``c128a replay``.

A case holds everything needed to rerun one failure without Hypothesis: the
property, the target it failed on, the concrete inputs (a
:class:`c128a.batch.Batch` as plain lists), plus the seed, Hypothesis's
reproduce blob, versions and the failure message for the reader. JSON only,
never pickle: a case is read by people and checked into ``tests/regressions``.

Kinds: ``failure`` (a property's check raised; the shrunk example),
``crash`` and ``hang`` (the input a fuzz worker was running when it died or
stopped answering), ``serving_loop`` (a failure of the stateful serving-loop
machine: its step list and reproduce blob, no concrete batch).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import importlib
import importlib.metadata
import io
import json
import os
import platform
import re
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .batch import Batch
from .validation import InvalidArgument

CASE_FORMAT = "c128a-case/1"
KINDS = ("failure", "crash", "hang", "serving_loop")
SERVING_LOOP = "serving_loop"
DEFAULT_CASES_DIR = "tests/regressions"
DEFAULT_PROPERTIES = "c128a.properties:PROPERTIES"
DEFAULT_MACHINE = "c128a.serving:serving_loop_machine"
VERSIONED_PACKAGES = ("c128a", "torch", "triton", "hypothesis")


class CaseError(ValueError):
    """A case file is malformed; the message names the file and the field."""

    def __init__(self, path: Path | str | None, field: str, rule: str):
        self.path, self.field, self.rule = path, field, rule
        where = f"{path}: " if path is not None else ""
        super().__init__(f"{where}field {field!r}: {rule}")


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


def import_object(spec: str) -> Any:
    """``MODULE:ATTR`` to the object (how the property map and the machine
    factory are named, so that spawned workers can import them too)."""
    module_name, _, attr = spec.partition(":")
    obj = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Case:
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
    path: Path | None = dataclasses.field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CASE_FORMAT,
            "property": self.property,
            "target": self.target,
            "device": self.device,
            "kind": self.kind,
            "batch": self.batch.to_json() if self.batch is not None else None,
            "seed": self.seed,
            "reproduce_blob": self.reproduce_blob,
            "steps": self.steps,
            "versions": dict(self.versions),
            "failure": self.failure,
            "created": self.created,
        }


def new_case(
    *,
    property: str,
    target: str,
    kind: str,
    failure: str,
    batch: Batch | None = None,
    device: str | None = None,
    seed: int | None = None,
    reproduce_blob: str | None = None,
    steps: str | None = None,
) -> Case:
    """A case stamped with the current versions and time."""
    assert kind in KINDS, kind
    return Case(
        property=property,
        target=target,
        kind=kind,
        failure=failure,
        batch=batch,
        device=device,
        seed=seed,
        reproduce_blob=reproduce_blob,
        steps=steps,
        versions=versions(),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
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


# ---------------------------------------------------------------- loading


_INT_FIELDS = {"num_decode_tokens", "max_model_len", "capacity", "width", "buffer_rows",
               "block_table_row_stride", "compress_ratio", "block_size", "table_junk"}
_INT_LIST_FIELDS = {"positions", "token_to_req_indices", "slot_mapping"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def batch_from_json(data: Any, path: Path | str | None = None, field: str = "batch") -> Batch:
    """A :class:`Batch` from its JSON, or :class:`CaseError` naming the bad field."""
    if not isinstance(data, dict):
        raise CaseError(path, field, f"must be an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Batch)}
    for name in sorted(set(data) - set(fields)):
        raise CaseError(path, f"{field}.{name}", "unknown field (not a Batch field)")
    for name, spec in fields.items():
        required = (
            spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        )
        if name not in data:
            if required:
                raise CaseError(path, f"{field}.{name}", "missing (required)")
            continue
        value = data[name]
        if name in _INT_FIELDS and not _is_int(value):
            raise CaseError(path, f"{field}.{name}", f"must be an int, got {value!r}")
        if name in _INT_LIST_FIELDS and not (
            isinstance(value, list) and all(_is_int(v) for v in value)
        ):
            raise CaseError(path, f"{field}.{name}", "must be a list of ints")
        if name == "block_table" and not (
            isinstance(value, list)
            and all(isinstance(row, list) and all(_is_int(v) for v in row) for row in value)
            and len({len(row) for row in value}) <= 1
        ):
            raise CaseError(path, f"{field}.{name}", "must be a list of equal-length lists of ints")
        if name == "labels" and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            raise CaseError(path, f"{field}.{name}", "must be a list of strings")
    try:
        batch = Batch.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CaseError(path, field, f"not a valid Batch: {exc}") from exc
    try:
        batch.validate()
    except InvalidArgument as exc:
        raise CaseError(path, field, f"outside the contract: {exc}") from exc
    return batch


def case_from_json(data: Any, path: Path | str | None = None) -> Case:
    """Validate a case's JSON; :class:`CaseError` names the first bad field."""
    if not isinstance(data, dict):
        raise CaseError(path, "<top level>", f"must be a JSON object, got {type(data).__name__}")
    if data.get("format") != CASE_FORMAT:
        raise CaseError(path, "format", f"must be {CASE_FORMAT!r}, got {data.get('format')!r}")
    for name in ("property", "target", "kind", "failure"):
        if not isinstance(data.get(name), str) or (name != "failure" and not data[name]):
            raise CaseError(path, name, f"must be a non-empty string, got {data.get(name)!r}")
    kind = data["kind"]
    if kind not in KINDS:
        raise CaseError(path, "kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    for name in ("device", "reproduce_blob", "steps", "created"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise CaseError(path, name, f"must be a string or null, got {data[name]!r}")
    if data.get("seed") is not None and not _is_int(data["seed"]):
        raise CaseError(path, "seed", f"must be an int or null, got {data['seed']!r}")
    recorded_versions = data.get("versions", {})
    if not isinstance(recorded_versions, dict):
        raise CaseError(path, "versions", "must be an object of name: version")
    batch = None
    if data.get("batch") is not None:
        batch = batch_from_json(data["batch"], path)
    elif kind == "failure":
        raise CaseError(path, "batch", "missing: a failure case needs its concrete inputs")
    if kind == SERVING_LOOP and not (data.get("reproduce_blob") or data.get("steps")):
        raise CaseError(path, "steps", "a serving_loop case needs its steps or reproduce_blob")
    return Case(
        property=data["property"],
        target=data["target"],
        kind=kind,
        failure=data["failure"],
        batch=batch,
        device=data.get("device"),
        seed=data.get("seed"),
        reproduce_blob=data.get("reproduce_blob"),
        steps=data.get("steps"),
        versions=dict(recorded_versions),
        created=data.get("created") or "",
        path=Path(path) if path is not None else None,
    )


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
    return case_from_json(data, path)


def case_files(cases_dir: Path | str) -> list[Path]:
    """Every ``*.json`` case in ``cases_dir``, sorted (stable test ids)."""
    return sorted(Path(cases_dir).glob("*.json"))


# ---------------------------------------------------------------- replay


@dataclass(frozen=True)
class Outcome:
    passed: bool
    report: str
    replayable: bool = True  # False: this installation cannot rerun the case at all


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


def _failure_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if not str(exc).strip():
        # A bare assert: the traceback's last frame is the only description.
        text += "\n" + "".join(traceback.format_exception(exc, limit=-1)).rstrip()
    return text


def replay_machine(case: Case, target, device, machine_factory) -> Outcome:
    """Rerun a serving-loop failure from its reproduce blob."""
    from hypothesis import __version__ as installed, reproduce_failure, settings
    from hypothesis.errors import DidNotReproduce
    from hypothesis.stateful import run_state_machine_as_test

    recorded = case.versions.get("hypothesis")
    if not case.reproduce_blob:
        return Outcome(False, "cannot replay: the case has no reproduce_blob; steps were:\n"
                       f"{case.steps}", replayable=False)
    if recorded and recorded != installed:
        return Outcome(
            False,
            f"cannot replay: the blob is from hypothesis {recorded}, installed is {installed}; "
            f"the recorded steps were:\n{case.steps}",
            replayable=False,
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
        return Outcome(False, f"{_failure_text(exc)}\n{steps or printed.getvalue()}".rstrip())
    replayed, recorded_calls = step_calls(printed.getvalue()), step_calls(case.steps)
    if recorded_calls and replayed != recorded_calls:
        # The blob encodes choices, not steps: after a change to the machine it
        # may drive different steps, and a pass would prove nothing.
        return Outcome(
            False,
            "cannot replay: the blob now drives different steps (the machine changed); "
            f"recorded:\n{case.steps}\nreplayed:\n{printed.getvalue()}",
            replayable=False,
        )
    return Outcome(True, "the recorded step sequence no longer fails")


def replay_case(
    case: Case,
    target,
    device,
    *,
    properties: dict | None = None,
    machine_factory=None,
) -> Outcome:
    """Run the case's check on ``target``: passed, or the failure's readable diff."""
    import torch

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
        return Outcome(False, f"cannot replay: this {case.kind} case has no concrete inputs")
    try:
        prop.check(target, case.batch, device)
    except Exception as exc:  # noqa: BLE001 - any error is the failure being replayed
        return Outcome(False, _failure_text(exc))
    return Outcome(True, "the check passes")


# ---------------------------------------------------------------- c128a replay


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from .cli import add_target_arguments

    parser.add_argument("files", nargs="+", metavar="FILE", help="case file(s) to rerun")
    add_target_arguments(parser)
    parser.add_argument("--properties", metavar="MODULE:ATTR", default=DEFAULT_PROPERTIES,
                        help=f"property mapping the cases name (default {DEFAULT_PROPERTIES})")
    parser.add_argument("--machine", metavar="MODULE:ATTR", default=DEFAULT_MACHINE,
                        help=f"serving-loop machine factory (default {DEFAULT_MACHINE})")
    parser.epilog = (
        "Without --target each case runs against the target it names. Exit status: 0 when "
        "every case passes now, 1 when one still fails, 2 when a file is malformed or "
        "cannot be replayed here."
    )


def run(args: argparse.Namespace) -> int:
    from .device import DeviceError, use_device
    from .targets import TargetSpecError, TargetUnavailable, load_target

    try:
        device = use_device(args.device or os.environ.get("C128A_DEVICE") or None)
    except DeviceError as exc:
        from .cli import usage_error

        usage_error(str(exc))
    still_failing = malformed = False
    for file in args.files:
        try:
            case = load_case(file)
        except CaseError as exc:
            print(f"error: {exc}", file=sys.stderr)
            malformed = True
            continue
        spec = args.target or case.target
        origin = "--target" if args.target else "the case"
        try:
            target = load_target(spec)
        except (TargetSpecError, TargetUnavailable) as exc:
            print(f"error: {file}: target {spec!r} (from {origin}): {exc}", file=sys.stderr)
            malformed = True
            continue
        print(f"case:     {file}")
        print(f"property: {case.property} ({case.kind}), recorded on {case.target}"
              f" ({case.device or '?'}), {case.created or 'undated'}")
        print(f"target:   {spec} (from {origin}), device {device}")
        if case.batch is not None:
            print(f"inputs:   {describe_batch(case.batch)}")
        try:
            outcome = replay_case(
                case,
                target,
                device,
                properties=import_object(args.properties),
                machine_factory=import_object(args.machine) if case.kind == SERVING_LOOP else None,
            )
        except CaseError as exc:
            print(f"error: {exc}", file=sys.stderr)
            malformed = True
            continue
        if outcome.passed:
            print("result:   PASSES now\n")
        elif not outcome.replayable:
            malformed = True
            print("result:   CANNOT REPLAY here")
            print("  " + outcome.report.replace("\n", "\n  ") + "\n")
        else:
            still_failing = True
            print("result:   STILL FAILS")
            print("  " + outcome.report.replace("\n", "\n  ") + "\n")
    if still_failing:
        return 1
    return 2 if malformed else 0
