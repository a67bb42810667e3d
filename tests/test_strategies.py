"""The strategies' own promises: what zero bytes decode to, where shrinking
ends, that a described block table is the table it describes, and that every
step they draw is inside the contract."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import find, given, settings, strategies as st

from c128a.checks import PROPERTIES
from c128a.contract import BLOCK_SIZE, COMPRESS_RATIO
from c128a.failures import BadArgument
from c128a.step import PAGE_PRIME, Batch, PermutedBlockTable
from c128a.strategies import HISTORICAL_BATCHES, batches
from c128a.strategies.engine import _length_edges, _requests_from_bytes, _sequence_length
from c128a.strategies.layout import REQUEST_BYTES

QUIET = settings(database=None, max_examples=200)


def test_zero_bytes_decode_to_the_simplest_requests():
    blob = bytes(3 * REQUEST_BYTES)
    requests = _requests_from_bytes(blob, max_tokens=32, max_query=8, max_len=81_920)
    assert [(r.seq_len, r.query_len) for r in requests] == [(1, 1)] * 3


def test_requests_stop_at_the_token_budget():
    blob = b"\xff" * (10 * REQUEST_BYTES)
    requests = _requests_from_bytes(blob, max_tokens=20, max_query=8, max_len=81_920)
    assert sum(r.query_len for r in requests) <= 20
    assert all(1 <= r.query_len <= 8 and r.query_len <= r.seq_len <= 81_920 for r in requests)


@given(selector=st.integers(0, 255), value=st.integers(0, 2**24 - 1), max_len=st.integers(1, 2**20))
def test_odd_selectors_pick_an_edge_and_every_length_is_in_range(selector, value, max_len):
    length = _sequence_length(selector, value, 1, max_len)
    assert 1 <= length <= max_len
    if selector & 1:
        assert length in _length_edges(max_len)


def test_shrinking_ends_at_the_documented_smallest_step():
    smallest = find(batches(), lambda batch: True, settings=QUIET)
    assert (smallest.num_tokens, smallest.max_model_len, smallest.capacity, smallest.width) == (
        0, 81_920, 640, 128
    )


def test_shrinking_a_decode_step_ends_at_one_token_at_position_zero():
    smallest = find(batches(), lambda batch: batch.num_decode_tokens > 0, settings=QUIET)
    assert smallest.positions == (0,) and smallest.num_decode_tokens == 1
    assert smallest.slot_mapping == (0,)


def _explicit(table: PermutedBlockTable) -> tuple[tuple[int, ...], ...]:
    rows, first = [], 0
    for need in table.pages_needed:
        pages = [(table.scale * k + table.offset) % table.prime for k in range(first, first + need)]
        rows.append(tuple(pages) + (table.junk,) * (table.width - need))
        first += need
    return tuple(rows)


permuted_tables = st.lists(st.integers(0, 9), min_size=1, max_size=6).flatmap(
    lambda needs: st.builds(
        PermutedBlockTable,
        pages_needed=st.just(tuple(needs)),
        width=st.integers(max(needs), max(needs) + 3),
        scale=st.integers(1, PAGE_PRIME - 1),
        offset=st.integers(0, PAGE_PRIME - 1),
        junk=st.integers(-(2**31), 2**31 - 1),
    )
)


@given(table=permuted_tables)
def test_a_permuted_table_is_the_table_it_describes(table):
    explicit = _explicit(table)
    assert tuple(table) == explicit and table == explicit and explicit == table
    assert table[-1] == explicit[-1] and table[1:] == explicit[1:]
    assert torch.equal(torch.from_numpy(table.array()), torch.tensor(explicit, dtype=torch.int32))
    pages = [page for row, need in zip(explicit, table.pages_needed) for page in row[:need]]
    assert len(set(pages)) == len(pages), "page numbers must be unique"


def test_a_permuted_table_refuses_rows_wider_than_its_width():
    with pytest.raises(BadArgument, match="width=2"):
        PermutedBlockTable(pages_needed=(3,), width=2)


@given(batch=batches(max_tokens=64))
def test_batch_tensors_are_the_same_for_a_described_and_an_explicit_table(batch):
    rows = tuple(tuple(row) for row in batch.block_table)
    explicit = dataclasses.replace(batch, block_table=rows)
    described, listed = batch.tensors("cpu"), explicit.tensors("cpu")
    for name in INPUT_NAMES:
        got, want = getattr(described, name), getattr(listed, name)
        assert got.shape == want.shape and got.stride() == want.stride(), name
        assert torch.equal(got, want), name
    assert torch.equal(described.memory.host, listed.memory.host)
    assert Batch.from_json(json.loads(json.dumps(batch.to_json()))) == batch


INPUT_NAMES = ("positions", "token_to_req_indices", "block_table", "slot_mapping")


@given(batch=batches(max_tokens=64))
def test_every_input_sits_where_its_placement_puts_it(batch):
    """Each input's persistent tensor starts on a 16-byte boundary, as an
    allocator hands it out; the input is its placement's elements into it,
    so it is unaligned exactly where the placement is no multiple of 16 bytes."""
    tensors = batch.tensors("cpu")
    for name in INPUT_NAMES:
        tensor = getattr(tensors, name)
        if tensor.numel() == 0:
            continue  # an empty tensor's address is no place in the copy
        offset = getattr(batch.inputs, name)
        start = tensor.data_ptr() - offset * tensor.element_size()
        assert start % 16 == 0, (name, offset)


# The harness computes expected values with the oracle unchecked
# (c128a.checks.expected_result), so every step the strategies draw must
# be inside the contract.
@given(batch=batches())
def test_strategies_draw_valid_steps(batch):
    batch.validate()


@given(batch=PROPERTIES["matches_oracle"].strategy(None, 512))
def test_strategies_draw_valid_large_steps(batch):
    batch.validate()


@settings(QUIET, max_examples=300)
@given(batch=PROPERTIES["compile_keys"].strategy(None, None))
def test_one_engine_configuration_a_step_with_its_own_model_length(batch):
    """compile_keys' steps keep the engine's R and B, while the model
    length is the step's own draw (which its row steers)."""
    assert (batch.compress_ratio, batch.block_size) == (COMPRESS_RATIO, BLOCK_SIZE)


def test_drawing_every_geometry_and_the_engines_only_is_refused():
    with pytest.raises(BadArgument, match="pass one"):
        batches(geometries=True, engine_geometry=True)


def test_historical_batches_are_valid():
    for batch in HISTORICAL_BATCHES.values():
        batch.validate()
