"""What a worker is running, and the one way any of it becomes a case.

Before each example a worker writes an :class:`InflightRecord` to its
in-flight file; the supervisor reads it only when the worker died, hung or
was cut short. :func:`case_from_inflight` turns a record into a case: the
worker's failures (found and shrunk, property and serving-loop) and the
supervisor's crash and hang cases all go through it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...cases import Case, contract_breach, new_case
from ...failures import CaseError
from ...step import Batch


@dataclass(frozen=True)
class InflightRecord:
    """An example a worker runs: its property (or the serving loop), the
    round's seed, the batch (None for a serving-loop example, or a failure
    in the draw), the serving-loop round's size, the profile and the
    padding-row variant; ``fault`` is set by a worker that exits on a CUDA
    fault."""

    property: str | None = None
    seed: int | None = None
    batch: Batch | None = None
    round_examples: int | None = None
    profile: str | None = None
    padding_rows: str | None = None
    fault: str | None = None
    historical: bool = False  # one of the property's explicit (@example) steps
    # Read back: the batch as written (kept for the report even when it is
    # malformed), and why it could not be read.
    batch_json: Any = dataclasses.field(default=None, compare=False)
    batch_problem: str | None = dataclasses.field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        record = {
            "property": self.property, "seed": self.seed,
            "batch": self.batch.to_json() if self.batch is not None else None,
            "round_examples": self.round_examples, "profile": self.profile,
            "padding_rows": self.padding_rows,
        }
        if self.fault is not None:
            record["fault"] = self.fault
        if self.historical:
            record["historical"] = True
        return record

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InflightRecord:
        """A record read back; what is missing is None, and a batch that
        does not parse is None with its problem said."""
        batch, problem = None, None
        if data.get("batch"):
            try:
                batch = Batch.from_json(data["batch"])
            except CaseError as exc:
                problem = str(exc)
        return cls(
            property=data.get("property"), seed=data.get("seed"), batch=batch,
            round_examples=data.get("round_examples"), profile=data.get("profile"),
            padding_rows=data.get("padding_rows"), fault=data.get("fault"),
            historical=data.get("historical") is True,
            batch_json=data.get("batch"), batch_problem=problem,
        )


def step_key(name: str | None, batch: Batch) -> str:
    """What names a step of property ``name`` across processes: the
    supervisor tells a restarted worker the historical steps to skip by it."""
    text = json.dumps([name, batch.to_json()], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def read_inflight(path: Path) -> InflightRecord | None:
    """The record in ``path``; None when there is none or it is not a JSON
    object (a worker that died before its first example, or inside a write)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return InflightRecord.from_json(data) if isinstance(data, dict) else None


class InflightFile:
    """The record of the example a worker is running, rewritten before each
    one, read by the supervisor only once the worker died or hung.

    One file kept open and overwritten in place with compact JSON, padded
    with spaces (valid JSON whitespace) to the longest record so far so that
    no truncation is needed: one ``pwrite`` an example. Writing a new
    temporary file and renaming it over the last one (what case files do)
    cost too much of a worker's time an example. A write is torn only if
    the worker dies inside it, never the case for a crash or hang in the
    example that follows it."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None
        self.size = 0

    def write(self, record: dict) -> None:
        data = json.dumps(record, separators=(",", ":")).encode()
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o666)
        self.size = max(self.size, len(data))
        os.pwrite(self.fd, data.ljust(self.size), 0)


def case_from_inflight(
    record: InflightRecord, *, kind: str, failure: str, target: str, device: str | None,
    padding_rows: str | None = None, reproduce_blob: str | None = None,
    steps: str | None = None,
) -> Case:
    """The case of ``record``'s example, which failed with ``failure`` (the
    record's CUDA fault, if any, appended). ``padding_rows`` is the variant
    when the record names none; a batch outside the contract's preconditions
    (a width the target's policy chose) says so in ``outside_contract``."""
    variant = record.padding_rows or padding_rows
    if record.fault:
        failure += f": {record.fault}"
    return new_case(
        property=record.property or "unknown",
        target=target,
        kind=kind,
        failure=failure,
        batch=record.batch,
        device=device,
        seed=record.seed,
        reproduce_blob=reproduce_blob,
        steps=steps,
        outside_contract=(
            contract_breach(record.batch, variant) if record.batch is not None else None
        ),
        round_examples=record.round_examples,
        profile=record.profile,
        padding_rows=variant,
    )
