"""Replaying a case: its check run again on a target, and the verdict.

A case replays from its concrete inputs; a serving-loop failure from its
reproduce blob where the Hypothesis version that wrote it is installed (a
shortcut), else from its recorded engine steps, with no Hypothesis at all;
without either, a property failure from its blob, a serving-loop round from
its seed; a sanitizer case under the tool that reported it. A case that has
none of these cannot be replayed. Cases written before serving-loop steps
were recorded replay from their blob as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from dataclasses import dataclass

import torch
from hypothesis import __version__ as HYPOTHESIS_VERSION
from hypothesis import reproduce_failure, seed, settings
from hypothesis.errors import DidNotReproduce
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument
from hypothesis.stateful import run_state_machine_as_test

from ..checked import load_machine, load_properties
from ..checks.profiles import register_profiles
from ..contract import padding_rows_of, target_capacity, target_width
from ..failures import CaseError, ContractViolation, failure_text, is_kill
from ..gpu import compute_sanitizer
from ..hypothesis_private import blob_misfit
from ..replay.recorded import MachineSteps, machine_steps_of
from ..step import Batch
from ..targets import held_to
from .format import SERVING_LOOP, Case, contract_breach

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
    tool = case.property.removeprefix(compute_sanitizer.PROPERTY_PREFIX)
    if case.batch is None:
        raise CaseError(case.path, "batch", "a sanitizer case needs its concrete inputs")
    if device.type != "cuda":
        return Outcome(CANNOT_REPLAY, f"a {tool} case replays on a GPU only (device {device})")
    try:
        run = compute_sanitizer.run_sanitizer(tool, target.spec, padding_rows=target.padding_rows,
                                      batches=[case.batch.to_json()])
    except compute_sanitizer.SanitizerUnavailable as exc:
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
    if case.property in compute_sanitizer.PROPERTIES:
        return replay_under_sanitizer(case, target, device)
    if case.property == SERVING_LOOP:
        if machine_factory is None:
            machine_factory = load_machine()
        return replay_machine(case, target, device, machine_factory)
    if properties is None:
        properties = load_properties()
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
