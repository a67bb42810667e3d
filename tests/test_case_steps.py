"""Serving-loop cases replay from the engine steps they recorded, under any
Hypothesis release: the reproduce blob is a shortcut, never the only record.

The kept serving-loop case (``c128a/conformance/regressions/``) was found on
the ``packed_stride`` mutant: replayed from its steps it must still fail
there (the replay is not vacuous) and pass on a correct target.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import hypothesis
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from c128a import cases, cli
from c128a.cases import rerun, store
from c128a.conformance import KEPT_CASES
from c128a.failures import ContractViolation
from c128a.replay import machine_steps_of, serving_loop_machine
from c128a.targets import load_target

KEPT_SERVING_LOOP = KEPT_CASES / "serving_loop-eb72c0efdf9f.json"
PACKED_STRIDE = "c128a.mutants:packed_stride"
# A Hypothesis release other than the one installed, which wrote the blob
# (CI also runs on the newest release, which may be any fixed one).
ANOTHER_RELEASE = "6.170.27" if hypothesis.__version__ != "6.170.27" else "6.170.26"
STRIDE_DIFF = "returned global_decode has strides"


def kept_copy(tmp_path: Path, edit) -> Path:
    data = json.loads(KEPT_SERVING_LOOP.read_text())
    edit(data)
    path = tmp_path / KEPT_SERVING_LOOP.name
    path.write_text(json.dumps(data))
    return path


def no_hypothesis(*args, **kwargs):
    raise AssertionError("a replay from recorded steps ran Hypothesis")


WITHOUT_A_USABLE_BLOB = {
    "blob removed": lambda d: d.update(reproduce_blob=None),
    "blob from another release": lambda d: d["versions"].update(hypothesis=ANOTHER_RELEASE),
}


@pytest.mark.parametrize("edit", WITHOUT_A_USABLE_BLOB.values(), ids=WITHOUT_A_USABLE_BLOB)
def test_the_kept_serving_loop_case_replays_from_its_steps_without_the_blob(
    tmp_path, monkeypatch, edit
):
    monkeypatch.setattr(rerun, "run_state_machine_as_test", no_hypothesis)
    case = cases.load_case(kept_copy(tmp_path, edit))
    assert case.machine_steps is not None and case.machine_steps.steps
    still = cases.replay_case(case, load_target(PACKED_STRIDE), "cpu")
    assert still.verdict == cases.FAILS, still.report
    assert STRIDE_DIFF in still.report
    assert "recorded engine step(s), without Hypothesis" in still.report
    fixed = cases.replay_case(case, load_target("reference"), "cpu")
    assert fixed.verdict == cases.PASSES, fixed.report


def test_a_blob_driving_other_steps_gives_way_to_the_recorded_steps(tmp_path):
    """This release reads the blob, but on a fixed target it drives other
    steps than those printed (as after a change to the machine), which
    would prove nothing: the recorded steps decide."""
    case = cases.load_case(kept_copy(tmp_path, lambda d: d.update(
        steps=d["steps"].replace("cached=0", "cached=5"))))
    if (problem := cases.blob_problem(case)) is not None:
        pytest.skip(f"the blob cannot run here: {problem}")
    fixed = cases.replay_case(case, load_target("reference"), "cpu")
    assert fixed.verdict == cases.PASSES, fixed.report
    assert "recorded engine step(s), without Hypothesis" in fixed.report
    assert "the blob now drives different steps" in fixed.report


def test_replay_command_replays_the_kept_case_from_its_steps(tmp_path, capsys, c128a_device):
    path = kept_copy(tmp_path, WITHOUT_A_USABLE_BLOB["blob from another release"])
    assert cli.main(["replay", str(path), "--device", c128a_device.type]) == 1
    out = capsys.readouterr().out
    assert "steps:    1 recorded engine step(s), max_model_len=262144" in out
    assert "STILL FAILS" in out and "without Hypothesis" in out and STRIDE_DIFF in out
    assert cli.main(["replay", str(path), "--device", c128a_device.type,
                     "--target", "reference"]) == 0


def test_the_kept_serving_loop_case_is_not_skipped_under_another_hypothesis(
    pytester, monkeypatch, c128a_device
):
    """The conformance suite's replay of the kept cases, with another
    Hypothesis release installed (the blob's version no longer matches): the
    serving-loop case runs and passes on a correct target, never skipped."""
    monkeypatch.setattr(rerun, "HYPOTHESIS_VERSION", ANOTHER_RELEASE)
    result = pytester.runpytest(
        "--pyargs", "c128a.conformance.test_regressions", "-p", "no:cacheprovider",
        f"--c128a-device={c128a_device.type}", "--c128a-target=reference",
        "-k", KEPT_SERVING_LOOP.stem, "-rs",
    )
    result.assert_outcomes(passed=1)


@pytest.fixture(scope="module")
def fresh_case(tmp_path_factory) -> Path:
    """A serving-loop case c128a fuzz saves now, on the mutant: its blob
    fits the machine as it is (the kept case's blob predates a rule added
    since, which is why that one replays from its steps)."""
    from c128a.runners import fuzz

    folder = tmp_path_factory.mktemp("fresh")
    report = fuzz.run_fuzz(fuzz.FuzzConfig(
        target=PACKED_STRIDE, device="cpu", max_examples=20, seed=1, workers=1, db="none",
        cases_dir=str(folder / "cases"), report=str(folder / "report.json"),
        exitfirst=True, chunk=10, only=(cases.SERVING_LOOP,), stateful=True, live=False,
    ))
    assert report["exit_status"] == 1, report
    [saved] = cases.case_files(folder / "cases")
    return saved


def fresh_copy(fresh: Path, tmp_path: Path, edit) -> Path:
    data = json.loads(fresh.read_text())
    edit(data)
    path = tmp_path / fresh.name
    path.write_text(json.dumps(data))
    return path


def test_a_serving_loop_case_without_steps_replays_from_its_blob_as_before(
    tmp_path, fresh_case
):
    """A case written before steps were recorded: its blob, where this
    Hypothesis wrote it; else it says why it cannot replay."""
    case = cases.load_case(fresh_copy(fresh_case, tmp_path, lambda d: d.pop("machine_steps")))
    still = cases.replay_case(case, load_target(PACKED_STRIDE), "cpu")
    assert still.verdict == cases.FAILS and "state.add_request" in still.report, still.report
    other = cases.load_case(fresh_copy(fresh_case, tmp_path, lambda d: (
        d.pop("machine_steps"), d["versions"].update(hypothesis=ANOTHER_RELEASE))))
    outcome = cases.replay_case(other, load_target("reference"), "cpu")
    assert outcome.verdict == cases.CANNOT_REPLAY
    assert f"its blob is from hypothesis {ANOTHER_RELEASE}" in outcome.report
    assert "no machine_steps" in outcome.report


def test_a_saved_case_records_the_steps_its_blob_drives(fresh_case):
    """A case's steps are those its blob drives, under the Hypothesis that
    wrote it."""
    case = cases.load_case(fresh_case)
    if (problem := cases.blob_problem(case)) is not None:
        pytest.skip(f"the blob cannot run here: {problem}")
    recorded = cases.machine_steps_from_blob(case, load_target(PACKED_STRIDE), "cpu",
                                             serving_loop_machine)
    assert recorded == case.machine_steps


def test_a_serving_loop_failure_is_saved_with_the_steps_it_built(tmp_path):
    """The machine's failure carries its engine steps; a case holding them
    (and no blob) round-trips through its file and replays from them."""
    target = load_target(PACKED_STRIDE)
    with pytest.raises(ContractViolation) as raised:
        run_state_machine_as_test(
            serving_loop_machine(target, "cpu"),
            settings=settings(max_examples=3, database=None, deadline=None, derandomize=True),
        )
    recorded = machine_steps_of(raised.value)
    assert recorded is not None and recorded.steps
    assert recorded.capture_width == 2048 and recorded.steps[-1].batch.width < 2048
    case = cases.new_case(property=cases.SERVING_LOOP, target=PACKED_STRIDE,
                          kind=cases.SERVING_LOOP, failure=str(raised.value), device="cpu",
                          machine_steps=recorded)
    path, new = cases.write_case(case, tmp_path)
    assert new
    loaded = cases.load_case(path)
    assert loaded.machine_steps == recorded
    assert cases.replay_case(loaded, target, "cpu").verdict == cases.FAILS
    assert cases.replay_case(loaded, load_target("reference"), "cpu").passed


@pytest.mark.parametrize("kept", cases.case_files(KEPT_CASES), ids=lambda p: p.name)
def test_no_kept_case_needs_its_blob(tmp_path, monkeypatch, kept):
    """Property cases replay from their concrete inputs, the serving-loop
    case from its steps: with the blob gone and another release recorded,
    each still fails on the mutant it was found on, and Hypothesis never runs."""
    data = json.loads(kept.read_text())
    data.update(reproduce_blob=None)
    data["versions"]["hypothesis"] = ANOTHER_RELEASE
    path = tmp_path / kept.name
    path.write_text(json.dumps(data))
    monkeypatch.setattr(rerun, "run_state_machine_as_test", no_hypothesis)
    case = cases.load_case(path)
    assert not cases.needs_its_blob(case)
    outcome = cases.replay_case(case, load_target(case.target), "cpu")
    assert outcome.verdict == cases.FAILS, outcome.report


def test_a_fuzz_run_saves_a_serving_loop_failure_with_its_steps(fresh_case):
    """c128a fuzz's serving-loop round on the mutant: the saved case holds the
    engine steps, and replays from them alone."""
    case = cases.load_case(fresh_case)
    assert case.machine_steps is not None and case.machine_steps.steps
    without_blob = dataclasses.replace(case, reproduce_blob=None)
    outcome = cases.replay_case(without_blob, load_target(PACKED_STRIDE), "cpu")
    assert outcome.verdict == cases.FAILS and STRIDE_DIFF in outcome.report


@pytest.mark.parametrize("edit, field, rule", [
    (lambda step: step["batch"].update(num_decode_tokens=1),
     "machine_steps.steps[0].batch", "outside the contract"),
    (lambda step: step["batch"].update(width="128"), "machine_steps.steps[0].batch.width",
     "must be an integer"),
    (lambda step: step.pop("description"), "machine_steps.steps[0].description",
     "missing (required)"),
])
def test_a_malformed_recorded_step_names_its_field(tmp_path, edit, field, rule):
    """A recorded step is read like a case's own batch: a bad one is the
    case's fault (naming the step), never a failure of the target."""
    path = kept_copy(tmp_path, lambda d: edit(d["machine_steps"]["steps"][0]))
    with pytest.raises(cases.CaseError) as raised:
        cases.load_case(path)
    assert raised.value.field == field and rule in raised.value.rule, raised.value


# ---------------------------------------------------------------- a failure at capture

CAPTURE_FAILS = "c128a.mutants:off_by_one_length"
"""A mutant whose engine's capture batch (W = C) already fails: the serving
loop's failure comes as its engine captures, before any step."""


@pytest.fixture(scope="module")
def capture_case(tmp_path_factory) -> Path:
    """The serving-loop case c128a fuzz saves on that mutant."""
    from c128a.runners import fuzz

    folder = tmp_path_factory.mktemp("capture")
    report = fuzz.run_fuzz(fuzz.FuzzConfig(
        target=CAPTURE_FAILS, device="cpu", max_examples=5, seed=1, workers=1, db="none",
        cases_dir=str(folder / "cases"), report=str(folder / "report.json"),
        exitfirst=True, chunk=5, only=(cases.SERVING_LOOP,), stateful=True, live=False,
    ))
    assert report["exit_status"] == 1, report
    [saved] = cases.case_files(folder / "cases")
    return saved


def test_a_serving_loop_failure_at_capture_replays_from_its_engine_without_the_blob(
    tmp_path, monkeypatch, capture_case
):
    """A failure found as the engine captures is saved with its engine (no
    step), so that under another Hypothesis release, or with no blob, it
    replays by capturing again: still failing on the mutant, passing on a
    correct target. (Before: no machine_steps, and such a case could not be
    replayed under another release.)"""
    case = cases.load_case(capture_case)
    assert case.machine_steps is not None and case.machine_steps.steps == ()
    assert (case.machine_steps.max_model_len, case.machine_steps.capture_width) == (262144, 2048)
    monkeypatch.setattr(rerun, "run_state_machine_as_test", no_hypothesis)
    without_blob = cases.load_case(fresh_copy(capture_case, tmp_path, lambda d: (
        d.update(reproduce_blob=None), d["versions"].update(hypothesis=ANOTHER_RELEASE))))
    still = cases.replay_case(without_blob, load_target(CAPTURE_FAILS), "cpu")
    assert still.verdict == cases.FAILS, still.report
    assert "global_decode_buffer row 0" in still.report and "without Hypothesis" in still.report
    assert "(no step: it failed at capture)" in still.report
    fixed = cases.replay_case(without_blob, load_target("reference"), "cpu")
    assert fixed.verdict == cases.PASSES, fixed.report


# ---------------------------------------------------------------- an edited case

EDITS = {
    "steps emptied": lambda steps: steps.update(steps=[]),
    "engine size changed": lambda steps: steps.update(max_model_len=131072),
    "a step's description changed": lambda steps: steps["steps"][0].update(description="[x]"),
}


@pytest.mark.parametrize("edit", EDITS.values(), ids=EDITS)
def test_an_edited_serving_loop_case_is_refused_naming_the_file_and_the_field(
    tmp_path, fresh_case, capsys, edit, c128a_device
):
    """The steps a case records are tied to it by the digest written with
    them: emptied or with another engine, they no longer hold the failure the
    case records, and replay refuses the case (exit 2, one line naming the
    file and the field) rather than call it passing. (Before: PASSES.)"""
    path = fresh_copy(fresh_case, tmp_path, lambda d: edit(d["machine_steps"]))
    with pytest.raises(cases.CaseError) as raised:
        cases.load_case(path)
    assert raised.value.field == "machine_steps"
    assert "changed since the case was written" in raised.value.rule
    assert cli.main(["replay", str(path), "--device", c128a_device.type,
                     "--target", "reference"]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith(f"error: {path}: field 'machine_steps': changed since"), line
    assert "PASSES" not in captured.out


def test_steps_edited_on_purpose_replay_once_their_digest_is_removed(tmp_path, fresh_case):
    """What the refusal says to do: without the digest, the edited steps
    are a case of their own and replay as they are."""
    path = fresh_copy(fresh_case, tmp_path, lambda d: (
        d["machine_steps"].update(steps=[]), d.pop("machine_steps_digest"),
        d.update(reproduce_blob=None)))
    outcome = cases.replay_case(cases.load_case(path), load_target(PACKED_STRIDE), "cpu")
    assert outcome.verdict == cases.PASSES and "0 recorded engine step(s)" in outcome.report


def test_the_kept_serving_loop_case_refuses_an_edit_of_its_engine(tmp_path):
    path = kept_copy(tmp_path, lambda d: d["machine_steps"].update(kv_slots=20800))
    with pytest.raises(cases.CaseError, match="'machine_steps': changed since"):
        cases.load_case(path)


def test_a_serving_loop_case_too_large_with_its_steps_is_saved_with_its_blob(
    tmp_path, monkeypatch, fresh_case
):
    """A serving-loop case whose recorded steps would make it larger than a
    case may be: saved without them (saying so), replayable from its blob,
    which drives the same steps again."""
    case = cases.load_case(fresh_case)
    if (problem := cases.blob_problem(case)) is not None:
        pytest.skip(f"the blob cannot run here: {problem}")
    without_steps = dataclasses.replace(case, machine_steps=None, machine_steps_digest=None)
    room = len(json.dumps(without_steps.to_json(), separators=(",", ":"))) + 400
    assert room < len(json.dumps(case.to_json(), separators=(",", ":")))
    monkeypatch.setattr(store, "MAX_CASE_BYTES", room)
    path, new = cases.write_case(case, tmp_path)
    assert new and path.stat().st_size <= room
    saved = cases.load_case(path)
    assert saved.machine_steps is None and "recorded engine step(s) were left out" in saved.failure
    outcome = cases.replay_case(saved, load_target(PACKED_STRIDE), "cpu")
    assert outcome.verdict == cases.FAILS and STRIDE_DIFF in outcome.report
