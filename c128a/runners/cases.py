"""Failure cases: self-describing JSON files, and replaying them.

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

A case replays from its concrete inputs; a serving-loop failure from its
reproduce blob where the Hypothesis version that wrote it is installed (a
shortcut), else from its recorded engine steps, with no Hypothesis at all;
without either, a property failure from its blob, a serving-loop round from
its seed. A case that has none of these cannot be replayed. Cases written
before serving-loop steps were recorded replay from their blob as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from hypothesis import __version__ as HYPOTHESIS_VERSION
from hypothesis import reproduce_failure, seed, settings
from hypothesis.errors import DidNotReproduce
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument
from hypothesis.stateful import run_state_machine_as_test

from ..checks.profiles import register_profiles
from ..contract import (
    DEFAULT_PADDING_ROWS,
    WIDTH_ALIGNMENT,
    PaddingRows,
    padding_rows_of,
    target_capacity,
    target_width,
)
from ..failures import BadArgument, CaseError, ContractViolation, failure_text, is_kill
from ..hypothesis_private import blob_misfit
from ..options import DEFAULT_CASES_DIR, DEFAULT_MACHINE, DEFAULT_PROPERTIES
from ..replay.recorded import MachineSteps, machine_steps_of
from ..step import Batch
from ..step.schema import INT32, Range, from_json, to_json
from ..targets import held_to, import_object
from . import sanitizer

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


def case_identity(case: Case) -> str:
    """A short hash of what makes the case: its kind, target, property,
    inputs and padding-row variant (not the message), so that two cases
    differing in any of these never share a file. Without concrete inputs:
    a serving-loop failure's steps; a crashed or hung round's seed and size
    (every such crash is its own case); a failure drawn from the target's
    policy, its blob. A serving-loop failure's printed steps name it even
    where its engine steps are recorded too (the kept files keep their names)."""
    if case.batch is not None:
        inputs: Any = {"kind": case.kind, "target": case.target, "batch": _batch_inputs(case)}
    elif case.kind == SERVING_LOOP and case.steps:
        inputs = {"kind": case.kind, "target": case.target, "steps": case.steps}
    elif case.kind == SERVING_LOOP and case.machine_steps is not None:
        inputs = {"kind": case.kind, "target": case.target,
                  "machine_steps": to_json(case.machine_steps)}
    elif case.kind in ("crash", "hang"):
        inputs = {"kind": case.kind, "target": case.target, "seed": case.seed,
                  "round_examples": case.round_examples, "steps": case.steps}
    else:
        inputs = {"kind": case.kind, "target": case.target, "blob": case.reproduce_blob}
    return _identity_hash(case, inputs)


def _batch_inputs(case: Case) -> dict[str, Any]:
    inputs = case.batch.to_json()
    inputs.pop("labels", None)  # labels describe the batch; they are not inputs
    return inputs


def _identity_hash(case: Case, inputs: Any) -> str:
    identity = [case.property, inputs]
    if case.padding_rows is not None:
        # The same inputs fail differently under the other variant; cases
        # recorded before variants existed keep their names.
        identity.append(case.padding_rows)
    text = json.dumps(identity, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def case_filename(case: Case) -> str:
    return f"{case.property}-{case_identity(case)}.json"


def former_case_filename(case: Case) -> str | None:
    """The name a case with concrete inputs was saved under before its kind
    and target were part of its identity (None for any other case: its name
    is unchanged)."""
    if case.batch is None:
        return None
    return f"{case.property}-{_identity_hash(case, _batch_inputs(case))}.json"


def readable_json(data: Any, indent: str = "") -> str:
    """JSON with one object key per line and every list of numbers or text
    on one line; a list of objects (a serving-loop case's steps) has one
    object after another (short diffs)."""
    inner = indent + "  "
    if isinstance(data, dict) and data:
        items = [f"{inner}{json.dumps(k)}: {readable_json(v, inner)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        items = [f"{inner}{readable_json(v, inner)}" for v in data]
        return "[\n" + ",\n".join(items) + f"\n{indent}]"
    return json.dumps(data)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _written_temporary(path: Path, text: str) -> Path:
    """``text`` in a temporary file beside ``path``, with the mode a new file
    gets (0666 under the umask, not mkstemp's 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o666 & ~_umask())
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Path(temporary)


def _replace_with(path: Path, text: str) -> None:
    temporary = _written_temporary(path, text)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``data`` as readable JSON so that a reader (or a crash) never
    sees half a file."""
    _replace_with(Path(path), readable_json(data) + "\n")


# ---------------------------------------------------------------- the file a case is saved as


MAX_CASE_BYTES = 64 << 20
"""The largest case file: :func:`load_case` reads no more, and a case is
never written larger (:func:`saved_form`). A 1M-context serving-loop step's
table is about 100 KB of it."""
KEPT_TEXT_CHARS = 32 << 10
"""What a case too large for :data:`MAX_CASE_BYTES` keeps of each end of
a text written for its reader (:data:`READERS_TEXTS`)."""
READERS_TEXTS = ("failure", "sanitizer_report", "steps")
"""The fields a case's replay does not run, in the order they are cut when
the case would be too large: the failure message, a sanitizer's report,
the steps as Hypothesis printed them."""


class CaseTooLarge(OSError):
    """A case that cannot be written within :data:`MAX_CASE_BYTES` even with
    its readers' texts cut: kept whole in the run's report instead."""


def _case_text(case: Case) -> str:
    """The case's JSON, readable where that fits in :data:`MAX_CASE_BYTES`,
    else without layout."""
    data = case.to_json()
    text = readable_json(data) + "\n"
    if _fits(text):
        return text
    return json.dumps(data, separators=(",", ":")) + "\n"


def _fits(text: str) -> bool:
    return len(text.encode()) <= MAX_CASE_BYTES


def _cut(text: str) -> str:
    cut = len(text) - 2 * KEPT_TEXT_CHARS
    return (f"{text[:KEPT_TEXT_CHARS]}\n[... {cut:,} characters cut here: the case would "
            f"have been larger than MAX_CASE_BYTES={MAX_CASE_BYTES:,}, the most `c128a replay` "
            f"reads ...]\n{text[-KEPT_TEXT_CHARS:]}")


def saved_form(case: Case) -> tuple[Case, str]:
    """``case`` as its file holds it, and the file's text, at most
    :data:`MAX_CASE_BYTES` (what :func:`load_case` reads): its
    ``machine_steps`` with their digest; where it would be larger, without
    layout, then with the middle of each reader's text cut (the failure
    message first), then, for a serving-loop case with a reproduce blob
    (which drives the same steps again: :func:`machine_steps_from_blob`),
    without its recorded steps. A case larger still raises
    :class:`CaseTooLarge`."""
    if case.machine_steps is not None:
        case = dataclasses.replace(
            case, machine_steps_digest=machine_steps_digest(to_json(case.machine_steps))
        )
    text = _case_text(case)
    for name in READERS_TEXTS:
        value = getattr(case, name)
        if _fits(text) or value is None or len(value) <= 2 * KEPT_TEXT_CHARS + 200:
            continue
        case = dataclasses.replace(case, **{name: _cut(value)})
        text = _case_text(case)
    if not _fits(text) and case.machine_steps is not None and case.reproduce_blob:
        steps = len(case.machine_steps.steps)
        case = dataclasses.replace(
            case, machine_steps=None, machine_steps_digest=None,
            failure=f"{case.failure}\n[its {steps} recorded engine step(s) were left out: with "
            f"them the case was larger than MAX_CASE_BYTES={MAX_CASE_BYTES:,}; it replays from "
            f"its reproduce_blob under hypothesis {case.versions.get('hypothesis', '?')}]",
        )
        text = _case_text(case)
    if not _fits(text):
        raise CaseTooLarge(
            errno.EFBIG, f"the {case.kind} case is {len(text.encode()):,} bytes even with its "
            f"readers' texts cut, more than MAX_CASE_BYTES={MAX_CASE_BYTES:,} (what c128a replay "
            "reads)"
        )
    return case, text


# ---------------------------------------------------------------- saving a case


OTHER_NAMES = 99
"""How many other names (``NAME-2.json`` ...) a case may take when files that
are not it hold its own."""


@dataclass(frozen=True)
class SavedCase:
    """Where :func:`save_case` saved a case: ``new`` False when the same case
    was there already; ``passed_over``: each name it could not take, with
    what holds it."""

    path: Path
    new: bool
    passed_over: tuple[str, ...] = ()


def _case_names(case: Case) -> list[str]:
    name = case_filename(case)
    stem = name.removesuffix(".json")
    return [name, *(f"{stem}-{number}.json" for number in range(2, OTHER_NAMES + 2))]


def _what_is_at(path: Path, case: Case) -> str | None:
    """What holds ``path`` in ``case``'s place: None when it is ``case``
    itself (a file that reads back as a case of the same identity), "" when
    nothing is there, else a description of what is."""
    if not os.path.lexists(path):
        return ""
    if os.path.islink(path) and not os.path.exists(path):
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    try:
        found = load_case(path)
    except CaseError as exc:
        return _recognised_file(path) or f"no case (field {exc.field!r}: {exc.rule})"
    if found.property == case.property and case_identity(found) == case_identity(case):
        return None
    return f"another case ({found.kind} of {found.property} on {found.target})"


def _recognised_file(path: Path) -> str | None:
    """What a file that is no case is, where its start says so."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(1 << 16)
    except OSError:
        return None
    if start.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer, not the case it stands for (git lfs pull fetches it)"
    if start.startswith(b"<<<<<<< ") or b"\n<<<<<<< " in start:
        return "a file with merge-conflict markers (<<<<<<<)"
    return None


def _read_back(path: Path, text: str) -> None:
    """``path`` holds ``text``, read from the disk again; else OSError."""
    try:
        with open(path, "rb") as handle:
            written = handle.read(MAX_CASE_BYTES + 1)
    except OSError as exc:
        raise OSError(exc.errno, f"{path} was written but cannot be read back: "
                      f"{exc.strerror or exc}") from exc
    if written != text.encode():
        raise OSError(errno.EIO, f"{path} was written but does not read back as written")


def save_case(case: Case, cases_dir: Path | str) -> SavedCase:
    """Save ``case`` (its :func:`saved_form`) in ``cases_dir`` under its name
    (:func:`case_filename`): new, or not when a file there reads back as the
    same case (by its identity), or one under the name it had before kind
    and target were part of it. A file there that is not the case (no case
    at all, another case, a dangling link, a Git LFS pointer, a merge
    conflict) is left as it is, and the case takes the next free name
    ``NAME-2.json``, ``NAME-3.json`` ... (``passed_over`` says why). The file
    is linked into place from a complete temporary file, so of several runs
    sharing ``cases_dir`` exactly one claims it new and no reader sees half a
    file, then read back: a case said saved is on the disk. OSError when it
    cannot be (a full disk, an unwritable folder, :class:`CaseTooLarge`)."""
    form, text = saved_form(case)
    folder = Path(cases_dir)
    names = _case_names(form)
    former = former_case_filename(form)
    if former is not None and _what_is_at(folder / former, form) is None:
        return SavedCase(folder / former, False)
    passed_over: list[str] = []
    temporary: Path | None = None
    try:
        for name in names:
            path = folder / name
            holder = _what_is_at(path, form)
            if holder == "":
                temporary = temporary or _written_temporary(path, text)
                try:
                    os.link(temporary, path)
                except FileExistsError:  # another run, this moment
                    holder = _what_is_at(path, form)
                else:
                    _read_back(path, text)
                    return SavedCase(path, True, tuple(passed_over))
            if holder is None:
                return SavedCase(path, False, tuple(passed_over))
            passed_over.append(f"{name} holds {holder or 'a file that came and went'}")
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
    raise OSError(errno.EEXIST, f"{names[0]} and its {OTHER_NAMES} other names in {folder} are "
                  "all held by files that are not this case")


def write_case(case: Case, cases_dir: Path | str) -> tuple[Path, bool]:
    """:func:`save_case`'s (path, new)."""
    saved = save_case(case, cases_dir)
    return saved.path, saved.new


def rewrite_case(path: Path | str, case: Case) -> None:
    """Replace the case file at ``path`` (one this run wrote) with ``case``,
    whole or not at all, and read it back."""
    _, text = saved_form(case)
    _replace_with(Path(path), text)
    _read_back(Path(path), text)


FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def regular_file_problem(path: Path | str) -> str | None:
    """Why ``path`` cannot be read as a file, found without opening it (a
    FIFO's open waits for a writer, forever); None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for is_kind, name in FILE_KINDS if is_kind(mode)), "a special file")
    return f"is {kind}, not a regular file; name a regular file"


def output_file_problem(path: Path | str, *, atomic: bool = True) -> str | None:
    """Why a file could not be written at ``path``, found before any work by
    writing an empty probe the same way; None when it can. ``atomic``: the
    way :func:`atomic_write_json` writes (a temporary file beside it, with a
    longer name, renamed over it); else the file opened in place (created
    and removed again when it was not there). ``path``'s folder must exist.
    Something there that is not a regular file (a folder, a FIFO, a device
    such as ``/dev/null``) is refused: the write would replace it, or wait
    for a reader."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there: its folder says why
        mode = None
    except OSError as exc:
        return f"cannot be looked up: {exc.strerror or exc}"
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((name for is_kind, name in FILE_KINDS if is_kind(mode)), "a special file")
        return f"is {kind}, not a regular file; name a regular file"
    folder = path.parent
    if not folder.is_dir():
        return f"its folder {folder} does not exist (or is not a folder); create it first"
    try:
        if atomic:
            handle, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
            os.close(handle)
            os.unlink(probe)
        elif mode is None:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.unlink(path)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # its content stays
    except OSError as exc:
        return (f"cannot be written in {folder}: {exc.strerror or exc}; name a file in a "
                "writable folder")
    return None


def load_case(path: Path | str) -> Case:
    """Read and validate one case file; anything wrong with it is a
    :class:`~c128a.failures.CaseError` naming the file, the field and the rule."""
    if (problem := regular_file_problem(path)) is not None:
        raise CaseError(path, "<file>", problem)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CASE_BYTES + 1)
    except OSError as exc:
        raise CaseError(path, "<file>", f"cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_CASE_BYTES:
        raise CaseError(path, "<file>", f"larger than {MAX_CASE_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CaseError(path, "<file>", f"not UTF-8 text: {exc}") from exc
    try:
        data = json.loads(text, object_pairs_hook=_object_with_unique_keys)
    except json.JSONDecodeError as exc:
        raise CaseError(path, "<file>", f"not JSON: {exc}") from exc
    except _DuplicateKey as exc:
        raise CaseError(
            path, exc.key, "appears twice in one JSON object; a reader keeps only one of the two "
            "values, so the file does not say which it means: keep one"
        ) from None
    except RecursionError:
        raise CaseError(path, "<file>", "JSON nested too deeply") from None
    try:
        return Case.from_json(data, path)
    except RecursionError:
        raise CaseError(path, "<file>", "JSON nested too deeply") from None


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key
        super().__init__(key)


def _object_with_unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice (json keeps the last silently)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key)
        data[key] = value
    return data


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


def needs_its_blob(case: Case) -> bool:
    """Whether only the reproduce blob can replay ``case``: it has neither
    concrete inputs nor recorded serving-loop steps."""
    return case.batch is None and case.machine_steps is None


def blob_problem(case: Case) -> str | None:
    """Why the case's reproduce blob cannot drive this installation's Hypothesis."""
    if not case.reproduce_blob:
        return "it has no reproduce_blob"
    recorded = case.versions.get("hypothesis")
    if recorded and recorded != HYPOTHESIS_VERSION:
        return f"its blob is from hypothesis {recorded}, installed is {HYPOTHESIS_VERSION}"
    if not case.reproduce_blob.isascii():
        return "its reproduce_blob is not base64 text"
    return None


def _bad_blob(exc: BaseException | None) -> Outcome | None:
    """A blob Hypothesis refuses (not base64, or not this test's choices), or
    one it could not run to its end (too few choices for this test, or an
    assumption it fails): either way the replay proves nothing."""
    if isinstance(exc, (HypothesisInvalidArgument, DidNotReproduce)):
        return Outcome(CANNOT_REPLAY, f"the reproduce_blob cannot drive this test: {exc}")
    return None


PASSED_MESSAGE = "completed successfully"
"""What Hypothesis's DidNotReproduce says when the pinned example ran to its
end and passed; its other DidNotReproduce errors say the blob did not fit.
Should a Hypothesis release reword it, a pass reads as cannot-replay, never
a misfit as a pass (test_target_policy_raising_is_a_failure_with_its_blob
replays a fixed target from a blob and would fail)."""


def _run_pinned(run, *, steps: bool = False) -> tuple[BaseException | None, str]:
    """Run a test pinned to a reproduce blob: (what it raised, what it printed).
    DidNotReproduce because the example passed (the failure is gone) comes
    back as None; because the blob did not fit the test (it ran out of
    choices, or an assumption failed), as itself, except for a state machine
    (``steps``): a fixed target runs past the recorded failing step and out
    of the recorded choices, so there it is None too and the caller compares
    the steps replayed with those recorded."""
    printed = io.StringIO()  # Hypothesis prints the steps as it replays them
    try:
        with contextlib.redirect_stdout(printed):
            run()
    except DidNotReproduce as exc:
        return (None if steps or PASSED_MESSAGE in str(exc) else exc), printed.getvalue()
    except Exception as exc:  # noqa: BLE001 - any error is the failure being replayed
        return exc, printed.getvalue()
    return None, printed.getvalue()


def replay_machine(case: Case, target, device, machine_factory) -> Outcome:
    """Rerun a serving-loop failure: from its reproduce blob where this
    Hypothesis can read it (a shortcut), else, or when the blob no longer
    drives the machine, from its recorded engine steps (no Hypothesis);
    a crashed or hung round from its seed."""
    problem = blob_problem(case)
    if problem is None:
        outcome = replay_machine_from_blob(case, target, device, machine_factory)
        if outcome.replayable or case.machine_steps is None:
            return outcome
        problem = outcome.report.splitlines()[0]
    if case.machine_steps is not None:
        return replay_machine_steps(case, target, device, machine_factory, problem)
    if case.kind in ("crash", "hang") and case.seed is not None and case.round_examples:
        return replay_round(case, target, device, machine_factory)
    steps = case.steps or "(none recorded)"
    return Outcome(CANNOT_REPLAY, f"{problem}, and it has no machine_steps; the recorded "
                   f"steps were:\n{steps}")


def replay_machine_steps(case: Case, target, device, machine_factory, why: str) -> Outcome:
    """Run a serving-loop case's recorded engine steps through the machine's
    engine and checks (its ``replay_recorded``): no Hypothesis, so any
    release replays it. ``why``: why the blob was not used."""
    recorded = case.machine_steps
    machine = machine_factory(target, device)
    replay = getattr(machine, "replay_recorded", None)
    if replay is None:
        return Outcome(
            CANNOT_REPLAY, f"{why}; the machine {machine.__name__} cannot replay recorded steps "
            "(it has no replay_recorded): replay with the default --machine"
        )
    how = (f"replayed from its {len(recorded.steps)} recorded engine step(s), without "
           f"Hypothesis ({why})")
    try:
        replay(recorded)
    except Exception as exc:  # noqa: BLE001 - any error is the failure being replayed
        return _verdict_of(exc, f"{failure_text(exc)}\n{how}:\n{recorded.listing()}")
    return Outcome(PASSES, f"the recorded steps no longer fail; {how}")


def _run_machine_blob(case: Case, target, device,
                      machine_factory) -> tuple[BaseException | None, str]:
    """Run the serving-loop machine on ``target`` pinned to the case's blob
    (this Hypothesis's): what it raised, and the steps it printed."""
    machine = machine_factory(target, device)
    pinned = type(machine.__name__, (machine,), {})
    reproduce_failure(HYPOTHESIS_VERSION, case.reproduce_blob.encode())(pinned)
    return _run_pinned(
        lambda: run_state_machine_as_test(pinned, settings=settings(database=None, deadline=None)),
        steps=True,
    )


def replay_machine_from_blob(case: Case, target, device, machine_factory) -> Outcome:
    """Rerun a serving-loop failure from its reproduce blob (this Hypothesis
    wrote it: :func:`blob_problem` is None)."""
    exc, printed = _run_machine_blob(case, target, device, machine_factory)
    if (refused := _bad_blob(exc)) is not None:
        return refused
    if exc is not None:
        steps = "\n".join(n for n in getattr(exc, "__notes__", ()) if "reproduce_failure" not in n)
        return _verdict_of(exc, f"{failure_text(exc)}\n{steps or printed}".rstrip())
    replayed, recorded_calls = step_calls(printed), step_calls(case.steps)
    if recorded_calls and replayed != recorded_calls:
        # The blob encodes choices, not steps: after a change to the machine it
        # may drive different steps, and a pass would prove nothing.
        return Outcome(
            CANNOT_REPLAY,
            "the blob now drives different steps (the machine changed); "
            f"recorded:\n{case.steps}\nreplayed:\n{printed}",
        )
    return Outcome(PASSES, "the recorded step sequence no longer fails")


def machine_steps_from_blob(case: Case, target, device, machine_factory) -> MachineSteps:
    """The engine steps a serving-loop case's blob drives the machine through
    on ``target`` (which must still fail), to record in a case written
    before steps were: its blob must be this Hypothesis's."""
    problem = blob_problem(case)
    if problem is not None:
        raise CaseError(case.path, "reproduce_blob", f"cannot record steps: {problem}")
    exc, _ = _run_machine_blob(case, target, device, machine_factory)
    recorded = machine_steps_of(exc)
    if recorded is None or not is_kill(exc):
        raise CaseError(case.path, "reproduce_blob", f"cannot record steps: on {target.spec} the "
                        f"blob drives no failing step ({failure_text(exc) if exc else 'it passes'})")
    return recorded


def replay_round(case: Case, target, device, machine_factory) -> Outcome:
    """Rerun the serving-loop round a worker crashed or hung in: the same
    seed and size, no database (a run whose database held failures replayed
    those first, so this is the round's generated part)."""
    profile = case.profile or "fuzz"
    register_profiles()
    machine = seed(case.seed)(type("ServingLoopRound", (machine_factory(target, device),), {}))
    round_settings = settings(
        parent=settings.get_profile(profile), database=None, max_examples=case.round_examples,
        report_multiple_bugs=False, derandomize=False,
    )
    try:
        run_state_machine_as_test(machine, settings=round_settings)
    except Exception as exc:  # noqa: BLE001 - any error is the failure being replayed
        return _verdict_of(exc, failure_text(exc))
    return Outcome(PASSES, f"the round of seed {case.seed} ({case.round_examples} examples) "
                   "now runs to its end")


def replay_from_blob(case: Case, prop, target, device) -> Outcome:
    """Rerun a property failure that has no concrete inputs (the target's
    policy raised while the step was drawn) from its reproduce blob."""
    problem = blob_problem(case)
    if problem is not None:
        return Outcome(CANNOT_REPLAY, f"this {case.kind} case has no concrete inputs and {problem}")
    misfits: list[str | None] = []

    def note_the_fit(batch, run) -> None:
        misfits.append(blob_misfit())
        run()

    test = prop.test(target, device, settings=settings(database=None, deadline=None),
                     examples=False, around=note_the_fit)
    reproduce_failure(HYPOTHESIS_VERSION, case.reproduce_blob.encode())(test)
    exc, _ = _run_pinned(test)
    if (refused := _bad_blob(exc)) is not None:
        return refused
    if exc is not None:
        # A contract violation is one whatever example it was found on.
        return _verdict_of(exc, failure_text(exc))
    misfit = misfits[0] if misfits else "the test never reached its check"
    if misfit is not None:
        return Outcome(CANNOT_REPLAY, f"the reproduce_blob cannot drive this test: {misfit}")
    return Outcome(PASSES, "the recorded example no longer fails")


def _as_the_target_chooses(batch: Batch, target) -> tuple[Batch, Outcome | None]:
    """An outside-contract case's inputs came from its target's own width
    policy (an unaligned width, say). Replayed on ``target``, the step takes
    the widths ``target``'s policy chooses for it: a target that still
    chooses widths outside the contract still fails; one that now chooses
    valid widths is checked at them."""
    try:
        capacity = target_capacity(target, batch.max_model_len, batch.compress_ratio)
        width = target_width(target, batch.max_seq_len, batch.compress_ratio, capacity)
    except ContractViolation as exc:
        return batch, Outcome(FAILS, failure_text(exc))
    chosen = dataclasses.replace(batch, capacity=capacity, width=width)
    breach = contract_breach(chosen, padding_rows_of(target)) if chosen != batch else None
    if breach is not None:
        return batch, Outcome(
            FAILS, f"the target's policy chooses capacity {capacity}, width {width} for this "
            f"step, outside the contract: {breach}"
        )
    return chosen, None


def replay_variant(case: Case, override: str | None = None) -> str | None:
    """The padding-row variant a case replays under: ``override`` (an option),
    else the one the case recorded; None (the target's own declaration) for
    a case recorded before variants existed."""
    return override or case.padding_rows


def replay_under_sanitizer(case: Case, target, device: torch.device) -> Outcome:
    """A sanitizer case: its step built again under the tool that reported it,
    in a child process on the GPU."""
    tool = case.property.removeprefix(sanitizer.PROPERTY_PREFIX)
    if case.batch is None:
        raise CaseError(case.path, "batch", "a sanitizer case needs its concrete inputs")
    if device.type != "cuda":
        return Outcome(CANNOT_REPLAY, f"a {tool} case replays on a GPU only (device {device})")
    try:
        run = sanitizer.run_sanitizer(tool, target.spec, padding_rows=target.padding_rows,
                                      batches=[case.batch.to_json()])
    except sanitizer.SanitizerUnavailable as exc:
        return Outcome(CANNOT_REPLAY, str(exc))
    if run.errors:
        return Outcome(CANNOT_REPLAY, "; ".join(run.errors))
    if run.findings:
        return Outcome(FAILS, "\n\n".join(f"{f.kind} at W={f.width}:\n{f.report}"
                                           for f in run.findings))
    return Outcome(PASSES, f"{tool} reports nothing ({run.summary or 'no summary'})")


def replay_case(
    case: Case, target, device, *, properties=None, machine_factory=None,
    padding_rows: str | None = None,
) -> Outcome:
    """Run the case's check on ``target``: passes, or the failure's readable
    diff. ``target`` is held to the padding-row variant :func:`replay_variant`
    chooses (``padding_rows``, an override, else the case's recorded one)."""
    device = torch.device(device)
    target = held_to(target, replay_variant(case, padding_rows))
    if case.property in sanitizer.PROPERTIES:
        return replay_under_sanitizer(case, target, device)
    if case.property == SERVING_LOOP:
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
            f"{case.property!r} is not a known property (known: "
            f"{', '.join(sorted([*properties, SERVING_LOOP]))})",
        )
    if case.batch is None:
        return replay_from_blob(case, prop, target, device)
    batch = case.batch
    if case.outside_contract is not None:
        batch, verdict = _as_the_target_chooses(batch, target)
        if verdict is not None:
            return verdict
    try:
        prop.replay(target, batch, device)
    except Exception as exc:  # noqa: BLE001 - any error is the failure being replayed
        return _verdict_of(exc, failure_text(exc))
    return Outcome(PASSES, "the check passes")
