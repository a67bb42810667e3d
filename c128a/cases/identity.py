"""A case's identity: what makes it, hashed into its file's name.

Two cases that differ in their kind, target, property, inputs or padding-row
variant never share a file; two that differ only in their message do. The
kept cases' names are part of the format: a change here renames them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..step.schema import to_json
from .format import SERVING_LOOP, Case


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
