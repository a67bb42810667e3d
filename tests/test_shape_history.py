"""Shape histories: the step built into a step's buffers before it may have
other decode and prefill rows, another R and B, and its buffers placed
otherwise. A step records that shape (``Batch.prior``), a case saves it and
``c128a replay`` rebuilds it; ``history_independent`` and the serving loop
build it; the mutants of :mod:`c128a.mutants.shape_history_faults` show it matters.
(Their reach is proven in ``tests/test_reach.py``.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings

from c128a import cases, cli
from c128a.checks import PROPERTIES, check_history_independent
from c128a.checks.prior_shape import earlier_buffers, shaped_earlier_step
from c128a.conformance.saved_failures import FailingSteps, save_failure
from c128a.failures import CaseError, ContractViolation, InvariantViolation
from c128a.replay import ReplayHarness
from c128a.step import Batch, Buffers, PriorStep
from c128a.strategies import HISTORICAL_BATCHES
from c128a.strategies.history import engine_batch
from c128a.strategies.shape_history import SHAPE_HISTORY_EXAMPLES
from c128a.targets import load_target

KEPT_CASE = (Path(__file__).parent.parent / "c128a" / "conformance" / "regressions"
             / "matches_oracle-b839eb151f69.json")


def _after(name: str, prior: PriorStep, prior_width: int = 0) -> Batch:
    """Historical step ``name`` after an earlier step of ``prior``'s shape."""
    batch = HISTORICAL_BATCHES[name]
    return dataclasses.replace(batch, prior=prior, prior_width=prior_width,
                               buffer_rows=max(batch.buffer_rows, prior.rows_needed))


def _round_trip(batch: Batch) -> Batch:
    return Batch.from_json(json.loads(json.dumps(batch.to_json())))


def test_a_prior_step_round_trips_through_json():
    batch = _after("no_prefill", PriorStep(70, 3, 4, 64, swapped=True, row_offset=2), 256)
    data = batch.to_json()
    assert data["prior"] == {"num_decode_tokens": 70, "num_prefill_tokens": 3,
                             "compress_ratio": 4, "block_size": 64, "swapped": True,
                             "row_offset": 2}
    assert _round_trip(batch) == batch


def test_a_step_without_a_prior_writes_what_it_wrote_before():
    """No ``prior`` key: a step without one writes the JSON it wrote before
    shape histories, so its case's identity hash and history_independent's
    seed stay the same."""
    case = cases.load_case(KEPT_CASE)
    assert case.batch.prior is None
    written = case.batch.to_json()
    # Fields added since (``inputs``) are left out at their defaults too.
    assert set(written) == {f.name for f in dataclasses.fields(Batch)} - {"prior", "inputs"}
    kept = json.loads(KEPT_CASE.read_text())["batch"]
    assert {name: written[name] for name in kept} == kept


def test_a_prior_outside_the_buffers_is_a_case_error():
    data = _after("no_prefill", PriorStep(2, 0, 128, 2)).to_json()
    data["prior"]["row_offset"] = data["buffer_rows"]
    with pytest.raises(CaseError, match=r"batch\.prior.*exceeds buffer_rows"):
        Batch.from_json(data, where="batch")
    data["prior"]["swapped"] = 1
    with pytest.raises(CaseError, match=r"batch\.prior\.swapped"):
        Batch.from_json(data, where="batch")


@pytest.mark.parametrize("prior_width", [0, 128])
def test_a_case_written_before_shape_histories_still_replays(
    tmp_path, capsys, prior_width, c128a_device
):
    """A kept case of the old format (no ``prior``; ``prior_width`` or
    not), replayed as a history_independent case: the same-shape earlier
    step, passing for a correct target and failing for a stateful mutant."""
    data = json.loads(KEPT_CASE.read_text())
    data["property"] = "history_independent"
    data["target"] = "c128a.mutants:remembers_last_write"
    if prior_width:
        data["batch"]["prior_width"] = prior_width
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert cases.load_case(path).batch.prior is None
    assert cli.main(["replay", str(path), "--device", c128a_device.type]) == 1
    assert "[history_independent] after the buffers held the poison -99 again" in (
        capsys.readouterr().out)
    assert cli.main(["replay", str(path), "--device", c128a_device.type,
                     "--target", "reference"]) == 0


@settings(max_examples=40, deadline=None)
@given(batch=PROPERTIES["history_independent"].strategy(None, None))
def test_earlier_steps_of_drawn_shape_histories_are_inside_the_contract(batch):
    earlier = shaped_earlier_step(batch)
    for variant in ("slots", "inert"):
        earlier.validate(variant)
    prior = batch.prior
    assert (earlier.num_decode_tokens, earlier.num_prefill_tokens) == (
        prior.num_decode_tokens, prior.num_prefill_tokens)
    assert (earlier.compress_ratio, earlier.block_size) == (prior.compress_ratio, prior.block_size)
    assert earlier.width == batch.earlier_width
    placed = earlier_buffers(Buffers.for_batch(batch, "meta"), prior)
    assert placed.global_decode.shape[0] >= earlier.num_decode_tokens
    assert placed.prefill.shape[0] >= earlier.num_prefill_tokens
    assert _round_trip(batch) == batch
    assert shaped_earlier_step(_round_trip(batch)) == earlier


# Each mutant, the step after an earlier step of the shape it trips on.
# Without that shape (prior None: the earlier step as before shape
# histories) the same step passes.
MUTANT_STEPS = {
    "decode_grid_from_last_build": _after("more_than_64_decode_rows", PriorStep(10, 2, 128, 2)),
    "prefill_scratch_from_first_build": _after("no_decode", PriorStep(0, 2, 128, 2)),
    "split_kept_per_token_count": _after("no_decode", PriorStep(5, 0, 128, 2)),
    "views_kept_per_workspace": _after("no_prefill", PriorStep(4, 0, 128, 2, swapped=True)),
    "geometry_of_first_build": _after("no_prefill", PriorStep(4, 0, 4, 2)),
}


@pytest.mark.parametrize("name", list(MUTANT_STEPS))
def test_each_shape_history_mutant_needs_the_shape_to_fail(c128a_device, name):
    mutant = load_target(f"c128a.mutants:{name}")
    batch = MUTANT_STEPS[name]
    check_history_independent(mutant, dataclasses.replace(batch, prior=None), c128a_device)
    with pytest.raises(InvariantViolation) as caught:
        check_history_independent(mutant, batch, c128a_device)
    assert str(caught.value).startswith(
        "[history_independent] after the buffers held an earlier step's result of another "
        "shape (c128a.checks.prior_shape.shaped_earlier_step of this step: "), str(caught.value)
    check_history_independent(load_target("reference"), batch, c128a_device)


def test_a_row_offset_keeps_the_rows_before_it():
    """The earlier step's buffers start ``row_offset`` rows in: its row 0 is
    the step's row ``row_offset``, and the rows before it are not written."""
    batch = _after("no_prefill", PriorStep(3, 1, 128, 2, swapped=True, row_offset=2))
    buffers = Buffers.for_batch(batch, "cpu")
    placed = earlier_buffers(buffers, batch.prior)
    assert placed.global_decode.data_ptr() == buffers.prefill[2:].data_ptr()
    assert placed.prefill.data_ptr() == buffers.global_decode[2:].data_ptr()
    assert placed.decode_lens.data_ptr() == buffers.decode_lens[2:].data_ptr()


def test_a_saved_case_rebuilds_its_shape_history(tmp_path, capsys, c128a_device):
    """A failing mutant's case: saved with its prior, replayed by ``c128a
    replay`` in this process to the same diff; a correct target passes it."""
    name = "geometry_of_first_build"
    target = load_target(f"c128a.mutants:{name}")
    prop = dataclasses.replace(PROPERTIES["history_independent"], examples=(MUTANT_STEPS[name],))
    steps = FailingSteps()
    with pytest.raises(ContractViolation) as raised:
        prop.test(target, c128a_device, around=steps,
                  settings=settings(max_examples=1, database=None, phases=[Phase.explicit]))()
    batch = steps.step_of(raised.value)
    assert batch is not None and batch.prior is not None
    save_failure(raised.value, batch, "history_independent", target, c128a_device, tmp_path)
    [path] = tmp_path.glob("history_independent-*.json")
    assert cases.load_case(path).batch == batch
    assert json.loads(path.read_text())["batch"]["prior"]["compress_ratio"] == (
        batch.prior.compress_ratio)
    assert cli.main(["replay", str(path), "--device", c128a_device.type]) == 1
    assert str(raised.value).splitlines()[0] in capsys.readouterr().out
    assert cli.main(["replay", str(path), "--device", c128a_device.type,
                     "--target", "reference"]) == 0


def test_the_shape_history_examples_are_inside_the_contract():
    for batch in SHAPE_HISTORY_EXAMPLES.values():
        batch.validate()
        shaped_earlier_step(batch).validate()


def _serving_step(harness: ReplayHarness, prior: PriorStep) -> Batch:
    """Two decode tokens on the harness's buffers after ``prior``'s step."""
    batch = engine_batch([(3 * 128, 1), (5 * 128 + 1, 1)], max_model_len=harness.max_model_len,
                         buffer_rows=harness.rows)
    return harness.pad(dataclasses.replace(batch, prior=prior))


def test_a_serving_step_builds_the_other_layers_step_first(c128a_device):
    """ReplayHarness.run_step builds a recorded step's prior first: a decode
    grid kept from the last build (that layer's, no decode rows) leaves this
    step's decode rows unwritten, which the replayed consumer reads."""
    prior = PriorStep(0, 9, 4, 64, swapped=True)
    for spec, fails in (("reference", False), ("c128a.mutants:decode_grid_from_last_build", True)):
        harness = ReplayHarness(load_target(spec), c128a_device, max_model_len=81_920,
                                kv_slots=1 << 12, capture_limit=4, buffer_rows=16)
        step = _serving_step(harness, prior)
        if not fails:
            harness.run_step(step)
            continue
        harness.run_step(dataclasses.replace(step, prior=None))  # without the other layer
        with pytest.raises(ContractViolation, match="replay mismatch"):
            harness.run_step(step)
