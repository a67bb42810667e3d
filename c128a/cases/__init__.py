"""Failure cases: self-describing JSON files, and replaying them.

A case is one failure, kept so that it reruns without Hypothesis. Its
format and validation are :mod:`~c128a.cases.format`; its identity, the
name of its file, :mod:`~c128a.cases.identity`; saving and loading it
:mod:`~c128a.cases.store`; replaying each kind of case and the verdict
:mod:`~c128a.cases.rerun`. This package only re-exports them, and the
error a case that cannot be read raises (:class:`~c128a.failures.CaseError`).
"""

from __future__ import annotations

from ..failures import CaseError
from .format import (
    CASE_FORMAT,
    KINDS,
    SERVING_LOOP,
    VERSIONED_PACKAGES,
    Case,
    breach_beside_widths,
    contract_breach,
    machine_steps_digest,
    new_case,
    versions,
)
from .identity import (
    case_filename,
    case_identity,
    former_case_filename,
)
from .store import (
    KEPT_TEXT_CHARS,
    MAX_CASE_BYTES,
    OTHER_NAMES,
    READERS_TEXTS,
    CaseTooLarge,
    SavedCase,
    case_files,
    load_case,
    rewrite_case,
    save_case,
    saved_form,
    write_case,
)
from .rerun import (
    CANNOT_REPLAY,
    FAILS,
    PASSED_MESSAGE,
    PASSES,
    Outcome,
    blob_problem,
    describe_batch,
    machine_steps_from_blob,
    needs_its_blob,
    replay_case,
    replay_from_blob,
    replay_machine,
    replay_machine_from_blob,
    replay_machine_steps,
    replay_round,
    replay_under_sanitizer,
    replay_variant,
    step_calls,
)

__all__ = [
    "CANNOT_REPLAY",
    "CASE_FORMAT",
    "Case",
    "CaseError",
    "CaseTooLarge",
    "FAILS",
    "KEPT_TEXT_CHARS",
    "KINDS",
    "MAX_CASE_BYTES",
    "OTHER_NAMES",
    "Outcome",
    "PASSED_MESSAGE",
    "PASSES",
    "READERS_TEXTS",
    "SERVING_LOOP",
    "SavedCase",
    "VERSIONED_PACKAGES",
    "blob_problem",
    "breach_beside_widths",
    "case_filename",
    "case_files",
    "case_identity",
    "contract_breach",
    "describe_batch",
    "former_case_filename",
    "load_case",
    "machine_steps_digest",
    "machine_steps_from_blob",
    "needs_its_blob",
    "new_case",
    "replay_case",
    "replay_from_blob",
    "replay_machine",
    "replay_machine_from_blob",
    "replay_machine_steps",
    "replay_round",
    "replay_under_sanitizer",
    "replay_variant",
    "rewrite_case",
    "save_case",
    "saved_form",
    "step_calls",
    "versions",
    "write_case",
]
