"""The CUDA-graph replay harness: captured consumers against the oracle consumer.

The harness's units, the mutants the replay must catch and the opt-in
stale-sentinel hazard; the selected target's replay is in
:mod:`c128a.conformance.test_replay`. Replay tests carry the ``graph`` marker
(``pytest -m graph``); on the CPU they run the emulation (views frozen with
``as_strided``), on a CUDA device the same tests capture real CUDA graphs.
Tests marked ``cuda`` as well force the real graph and compare it with the
emulation.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from c128a.failures import BadArgument, ReplayMismatch, StaleSentinelHazard
from c128a.plugin.pytest_plugin import resolve_strict_sentinels
from c128a.replay import (
    KV_VALUE_BASE,
    OUT_OF_TABLE,
    ReplayHarness,
    capture_sizes,
    consume,
    pad_decode_to_capture_size,
    padded_size,
    sentinel_lengths,
)
from c128a.replay.scenarios import (
    LONG_MODEL_LEN,
    R,
    SCENARIOS,
    SMALL_MODEL_LEN,
    harness_for,
    run_scenario,
    step,
    top_of_band,
)
from c128a.step import Batch
from c128a.targets import load_target

PACKED = "c128a.mutants:packed_stride"
SPILL = "c128a.mutants:spill_past_width"


# --- units ------------------------------------------------------------------


def test_capture_sizes_are_powers_of_two_up_to_the_limit():
    assert capture_sizes(32) == (1, 2, 4, 8, 16, 32)
    assert capture_sizes(24) == (1, 2, 4, 8, 16, 24)
    assert capture_sizes(1) == (1,)
    with pytest.raises(BadArgument, match="limit=0 must be an int >= 1"):
        capture_sizes(0)


def test_padded_size_is_the_smallest_capture_size_that_fits():
    sizes = capture_sizes(8)
    assert [padded_size(n, sizes) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    with pytest.raises(BadArgument, match="count=9 tokens exceed the largest capture size 8"):
        padded_size(9, sizes)


def test_padding_tokens_follow_the_decode_tokens_with_negative_slots():
    batch = Batch(
        positions=(500, 700, 900, 40),
        num_decode_tokens=3,
        token_to_req_indices=(0, 1, 1, 0),
        block_table=((1, 2, 3), (4, 5, 6)),
        slot_mapping=(500, 700, 900, 40),
        max_model_len=SMALL_MODEL_LEN,
        capacity=640,
        width=128,
        buffer_rows=8,
    )
    padded = pad_decode_to_capture_size(batch, capture_sizes(8))
    assert padded.num_decode_tokens == 4
    assert padded.positions == (500, 700, 900, 0, 40)
    assert padded.token_to_req_indices == (0, 1, 1, 1, 0)
    assert padded.slot_mapping == (500, 700, 900, -1, 40)
    assert pad_decode_to_capture_size(padded, capture_sizes(8)) == padded


def test_consume_stops_at_lens_and_marks_reads_outside_the_table():
    kv = torch.arange(10, dtype=torch.int64) + KV_VALUE_BASE
    indices = torch.tensor([[3, 4, -1, 9], [12, -99, 5, 6], [1, 2, 3, 4]], dtype=torch.int32)
    lens = torch.tensor([2, 3, 0], dtype=torch.int32)
    expected = torch.tensor(
        [
            [KV_VALUE_BASE + 3, KV_VALUE_BASE + 4, 0, 0],
            [OUT_OF_TABLE, OUT_OF_TABLE, KV_VALUE_BASE + 5, 0],
            [0, 0, 0, 0],
        ]
    )
    assert torch.equal(consume(indices, lens, kv), expected)
    assert sentinel_lengths(indices).tolist() == [2, 4, 4]


def test_triton_consumer_kernel_matches_the_emulated_consumer(c128a_device):
    from c128a.kernels.consumer_kernel import launch_consumer

    # Strided indices (row stride 384 > width 256), lens past the width, zero,
    # negative (poison), and indices outside the table.
    storage = torch.arange(4 * 384, dtype=torch.int32, device=c128a_device) % 700 - 50
    indices = storage.view(4, 384)[:, :256]
    lens = torch.tensor([300, 0, -99, 130], dtype=torch.int32, device=c128a_device)
    kv = torch.arange(600, dtype=torch.int64, device=c128a_device) * 3 + KV_VALUE_BASE
    seen = torch.empty((4, 256), dtype=torch.int32, device=c128a_device)
    lens_seen = torch.empty(4, dtype=torch.int32, device=c128a_device)
    gathered = torch.empty((4, 256), dtype=torch.int64, device=c128a_device)
    launch_consumer(indices, lens, kv, seen, lens_seen, gathered, OUT_OF_TABLE)
    assert torch.equal(seen, indices)
    assert torch.equal(lens_seen, lens)
    assert torch.equal(gathered, consume(indices, lens, kv))


def test_strict_sentinels_resolves_flag_then_environment():
    assert resolve_strict_sentinels(None, None) == (False, "default")
    assert resolve_strict_sentinels(True, "0") == (True, "--c128a-strict-sentinels")
    assert resolve_strict_sentinels(None, "1") == (True, "$C128A_STRICT_SENTINELS")
    assert resolve_strict_sentinels(None, "off") == (False, "$C128A_STRICT_SENTINELS")
    with pytest.raises(pytest.UsageError, match="invalid value 'maybe' from"):
        resolve_strict_sentinels(None, "maybe")


def test_harness_refuses_an_unpadded_batch(c128a_device):
    harness = harness_for(load_target("reference"), c128a_device)
    batch = step(harness, [(0, 300), (1, 400), (2, 500)])
    unpadded = dataclasses.replace(
        batch,
        positions=batch.positions[:3],
        num_decode_tokens=3,
        token_to_req_indices=batch.token_to_req_indices[:3],
        slot_mapping=batch.slot_mapping[:3],
    )
    with pytest.raises(BadArgument, match=r"num_decode_tokens=3 is not a capture size"):
        harness.run_step(unpadded)


# --- the mutants fail the replay -------------------------------------------------


@pytest.mark.graph
def test_packed_stride_mutant_is_read_wrong_from_decode_row_one(c128a_device):
    """The reverted change's mechanism: captured at W = C (stride C), a later
    step at W < C writes packed rows at stride W, so the captured consumer reads
    decode row 1 onward from the wrong bytes; row 0 still reads right."""
    harness = harness_for(load_target(PACKED), c128a_device, check_window=False)
    batch = step(harness, [(0, 9000), (1, 10000)])
    assert batch.width == 128
    with pytest.raises(ReplayMismatch) as failure:
        harness.run_step(batch)
    mismatch = failure.value
    assert (mismatch.kind, mismatch.section, mismatch.row) == ("output", "decode", 1)
    assert "strides (640, 1)" in str(mismatch) and "strides (128, 1)" in str(mismatch)


@pytest.mark.graph
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_packed_stride_mutant_fails_every_scenario(c128a_device, scenario):
    harness = harness_for(load_target(PACKED), c128a_device)
    with pytest.raises(ReplayMismatch):
        run_scenario(harness, SCENARIOS[scenario])


@pytest.mark.graph
def test_spill_past_width_mutant_changes_what_the_consumer_sees(c128a_device):
    """Columns [W, W_capture) are the capture's stale indices, which the
    contract leaves alone; the mutant overwrites them with -1."""
    harness = harness_for(load_target(SPILL), c128a_device)
    with pytest.raises(ReplayMismatch) as failure:
        harness.run_step(step(harness, [(0, 16000), (1, 17000)]))
    mismatch = failure.value
    assert (mismatch.kind, mismatch.section) == ("window", "decode")
    assert mismatch.column >= 128
    assert "a column >= W the step must not write" in str(mismatch)


# --- the opt-in stale-sentinel hazard ------------------------------------------


def hazard_step(harness: ReplayHarness) -> Batch:
    """W = 128 < W_capture and a decode token whose list is exactly 128 long:
    its row has no -1 before W, and columns [128, 640) hold the capture's indices."""
    return step(harness, [(0, top_of_band(128)), (1, 5000)])


@pytest.mark.graph
@pytest.mark.parametrize("spec", ["triton", "reference"])
def test_strict_sentinel_check_trips_for_correct_targets(c128a_device, spec):
    harness = harness_for(load_target(spec), c128a_device, strict_sentinels=True)
    with pytest.raises(StaleSentinelHazard) as failure:
        harness.run_step(hazard_step(harness))
    hazard = failure.value
    assert (hazard.step, hazard.section, hazard.row) == (1, "decode", 0)
    assert hazard.columns == (128, 640)
    report = str(hazard)
    assert "columns [128, 640), which this step did not write" in report
    assert "stale indices there: [" in report


@pytest.mark.graph
@pytest.mark.parametrize("spec", ["triton", "reference"])
def test_stale_sentinel_hazard_is_only_reported_by_default(c128a_device, spec):
    harness = harness_for(load_target(spec), c128a_device)
    outcome = harness.run_step(hazard_step(harness))
    assert len(outcome.hazards) == 1 and "stale-sentinel hazard at step 1" in outcome.hazards[0]


@pytest.mark.graph
def test_no_stale_sentinel_hazard_when_a_minus_one_ends_every_row(c128a_device):
    harness = harness_for(load_target("reference"), c128a_device, strict_sentinels=True)
    outcome = harness.run_step(step(harness, [(0, top_of_band(128) - R), (1, 5000)]))
    assert outcome.hazards == []


# --- real CUDA graphs ------------------------------------------------------------


def replay_failure(harness: ReplayHarness, steps) -> str | None:
    try:
        run_scenario(harness, steps)
    except ReplayMismatch as exc:
        return str(exc)
    return None


@pytest.mark.graph
@pytest.mark.cuda
@pytest.mark.parametrize("spec", [PACKED, SPILL])
def test_cuda_graph_replay_fails_for_mutant(c128a_device, spec):
    harness = harness_for(load_target(spec), c128a_device, LONG_MODEL_LEN, mode="cuda")
    with pytest.raises(ReplayMismatch):
        run_scenario(harness, SCENARIOS["decode rows below capacity"])


@pytest.mark.graph
@pytest.mark.cuda
@pytest.mark.parametrize("spec", ["triton", PACKED, SPILL])
def test_cuda_graph_reads_what_the_emulation_reads(c128a_device, spec):
    """The emulation is faithful: a real graph and the frozen-view emulation,
    driven through the same steps, fail (or pass) with the same report."""
    reports = []
    for mode in ("cuda", "emulate"):
        harness = harness_for(load_target(spec), c128a_device, LONG_MODEL_LEN, mode=mode)
        reports.append(replay_failure(harness, SCENARIOS["width up then down"]))
    assert reports[0] == reports[1]
    assert (reports[0] is None) == (spec == "triton")
