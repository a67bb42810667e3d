"""history_independent: its prior contents replay from the saved step alone,
stay inside the contract, and its diff names the prior content that exposed
a difference. (The property itself runs in c128a/conformance/test_properties.py, its
mutant in tests/test_mutants.py.)"""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch
from hypothesis import given, settings

from c128a.checks import PROPERTIES, check_history_independent, earlier_step, fill_seed
from c128a.checks.prior_content import random_buffers, widest_width
from c128a.contract import BuildArgs, contract_builder, returned_views
from c128a.contract.oracle import write_metadata
from c128a.failures import HarnessError, InvariantViolation
from c128a.step import Batch, Buffers
from c128a.strategies import HISTORICAL_BATCHES
from c128a.targets import Target, load_target


def _round_trip(batch: Batch) -> Batch:
    return Batch.from_json(json.loads(json.dumps(batch.to_json())))


def _check_earlier(batch: Batch) -> None:
    earlier = earlier_step(batch)
    earlier.validate()  # inside the contract: a correct target builds it
    for name in ("buffer_rows", "capacity", "prefill_extra_columns", "num_decode_tokens"):
        assert getattr(earlier, name) == getattr(batch, name), name
    # The width the step records for the step before it, or the widest.
    assert earlier.width == (batch.prior_width or widest_width(batch))
    assert widest_width(batch) >= max(earlier.width, batch.width)
    assert earlier.num_tokens == batch.num_tokens
    replayed = _round_trip(batch)
    assert earlier_step(replayed) == earlier
    assert fill_seed(replayed) == fill_seed(batch)


@pytest.mark.parametrize("name", list(HISTORICAL_BATCHES))
def test_prior_contents_replay_from_the_saved_step(name):
    _check_earlier(HISTORICAL_BATCHES[name])


@settings(max_examples=30)
@given(batch=PROPERTIES["history_independent"].strategy(None, None))
def test_earlier_step_of_drawn_steps_is_inside_the_contract(batch):
    _check_earlier(batch)


def test_random_prior_content_is_a_function_of_the_seed():
    batch = HISTORICAL_BATCHES["no_decode"]
    one, two = random_buffers(batch, 7), random_buffers(batch, 7)
    assert all(torch.equal(a, b) for a, b in zip(one.as_tuple(), two.as_tuple()))
    other = random_buffers(batch, 8)
    assert not torch.equal(one.prefill, other.prefill)
    assert one.prefill.shape == Buffers.for_batch(batch, "cpu").prefill.shape


def _faulty(name: str, keep) -> Target:
    """The oracle, except that it leaves an element alone where
    ``keep(old, new)`` holds (old: what the buffer held, new: the oracle's)."""

    def build(args: BuildArgs):
        scratch = [buffer.clone() for buffer in
                   (args.global_decode_buffer, args.decode_lens_buffer, args.prefill_buffer)]
        write_metadata(args._replace(
            global_decode_buffer=scratch[0], decode_lens_buffer=scratch[1],
            prefill_buffer=scratch[2]))
        for buffer, new in zip(
            (args.global_decode_buffer, args.decode_lens_buffer, args.prefill_buffer), scratch
        ):
            buffer.copy_(torch.where(keep(buffer, new), buffer, new))
        return returned_views(args)

    return Target.from_object(name, types.SimpleNamespace(
        build_c128a_topk_metadata=contract_builder(build, name)))


def _first_column_matches(old, new):
    """Keep a whole row whose first element already holds the new value."""
    if old.dim() == 1:
        return torch.zeros_like(old, dtype=torch.bool)
    return (old[:, :1] == new[:, :1]).expand_as(old)


def _unrecognised(old, new):
    """Keep any value no build writes (beyond +-2**21): 'someone else's'."""
    return old.abs() > 2**21


@pytest.mark.parametrize(
    "target, batch, prior",
    [
        (load_target("c128a.mutants:remembers_last_write"), "no_prefill",
         "the poison -99 again"),
        (_faulty("first_column_fingerprint", _first_column_matches), "no_decode",
         "an earlier step's result"),
        (_faulty("keeps_unrecognised_values", _unrecognised), "no_decode",
         "random int32 values"),
    ],
    ids=["poison", "earlier", "random"],
)
def test_the_diff_names_the_prior_content_and_the_place(c128a_device, target, batch, prior):
    batch = HISTORICAL_BATCHES[batch]
    with pytest.raises(InvariantViolation) as caught:
        check_history_independent(target, batch, c128a_device)
    message = str(caught.value)
    assert message.startswith(f"[history_independent] after the buffers held {prior}"), message
    assert " row " in message and ", column " in message, message
    assert "expected" in message and "got" in message, message


def test_every_correct_build_passes_from_every_prior(c128a_device):
    reference = load_target("reference")
    for batch in HISTORICAL_BATCHES.values():
        check_history_independent(reference, batch, c128a_device)


def test_an_earlier_step_of_other_buffers_is_a_harness_error(c128a_device):
    batch = HISTORICAL_BATCHES["no_decode"]
    wider = earlier_step(dataclasses.replace(batch, buffer_rows=batch.buffer_rows + 1))
    with pytest.raises(HarnessError, match="buffer_rows"):
        check_history_independent(load_target("reference"), batch, c128a_device, earlier=wider)


def test_a_saved_failure_replays_with_the_same_diff(c128a_device):
    """The seed, the earlier step and so the whole diff come from the Batch:
    the same step read back from its JSON fails with the same message."""
    prop = PROPERTIES["history_independent"]
    target = _faulty("keeps_unrecognised_values", _unrecognised)
    batch = HISTORICAL_BATCHES["padding_tail_and_inside"]
    messages = []
    for step in (batch, _round_trip(batch)):
        with pytest.raises(InvariantViolation) as caught:
            prop.replay(target, step, c128a_device)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert f"seed {fill_seed(batch)}" in messages[0]


def test_a_stale_inert_padding_position_stays_within_the_table_once_real(c128a_device):
    """Under ``inert`` a stale padding position may reach past the table (its
    row reads no entry); the earlier step makes that token real, and must
    keep it within the table's columns, else a correct target refuses the
    earlier step and the harness reads as a kill (found on the H200, gpu
    profile, reference-inert)."""
    from c128a.step import PermutedBlockTable, PriorStep

    batch = Batch(
        positions=(0, 1, 1, 513), num_decode_tokens=4, token_to_req_indices=(0, 0, 0, 0),
        block_table=PermutedBlockTable(pages_needed=(0,), width=1, scale=1, offset=0, junk=-7,
                                       prime=1_000_003),
        slot_mapping=(-1, -1, -1, -1), max_model_len=81_920, capacity=640, width=128,
        buffer_rows=4, prior=PriorStep(num_decode_tokens=4, num_prefill_tokens=0,
                                       compress_ratio=128, block_size=2, swapped=False,
                                       row_offset=0),
    )
    earlier = earlier_step(batch)
    assert max(earlier.positions[:4]) + 1 < 3 * 128  # at most 2 entries: 1 column x B = 2
    check_history_independent(load_target("reference-inert"), batch, c128a_device)
