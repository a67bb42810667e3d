"""One engine step's input to the builder, as plain data.

A :class:`Batch` holds only ints and lists of ints, so it prints readably when
Hypothesis shrinks a failure and serialises to JSON as a regression case.
:meth:`Batch.tensors` turns it into the builder's arguments on a device, and
:func:`build` runs a target on it into freshly poisoned persistent buffers.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import torch

from . import policy

POISON = -99
"""Fill value of every buffer before a build: anything still -99 was not written."""

PAGE_PRIME = 1_000_003
"""Page numbers are an affine permutation modulo this prime: unique, shuffled,
and small enough that ``page * block_size`` fits in int32."""


@dataclass(frozen=True, eq=False)
class PermutedBlockTable(Sequence):
    """Block-table rows of unique, shuffled page numbers, held as the few ints
    that describe them.

    Row ``r`` holds ``pages_needed[r]`` pages ``(scale * k + offset) % prime``
    for consecutive ``k`` (counting on from the previous row), then ``junk``
    up to ``width`` columns. It is a sequence of row tuples like the explicit
    form (rows materialise when indexed, and it equals the explicit table it
    describes), but :meth:`Batch.tensors` builds it with a few array ops: a
    1M-context step's table holds hundreds of thousands of entries, too many
    to handle one Python int at a time on every example.
    """

    pages_needed: tuple[int, ...]
    width: int
    scale: int = 1
    offset: int = 0
    junk: int = -7
    prime: int = PAGE_PRIME

    def __post_init__(self):
        if self.width < max(self.pages_needed, default=0):
            raise ValueError(f"width={self.width} < the largest row need {max(self.pages_needed)}")

    @functools.cached_property
    def _first_pages(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate(self.pages_needed, initial=0))

    def __len__(self) -> int:
        return len(self.pages_needed)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        row = range(len(self))[index]  # IndexError and negative indices as a tuple's
        first, need = self._first_pages[row], self.pages_needed[row]
        pages = tuple(
            (self.scale * k + self.offset) % self.prime for k in range(first, first + need)
        )
        return pages + (self.junk,) * (self.width - need)

    def __eq__(self, other) -> bool:
        if isinstance(other, PermutedBlockTable):
            if dataclasses.astuple(self) == dataclasses.astuple(other):
                return True
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def array(self) -> np.ndarray:
        """The rows as an int32 array [len(self), width]. Only the needed
        entries go through the modulo, in one flat pass: the junk half of a
        table costs a fill, not arithmetic."""
        total = self._first_pages[-1]
        pages = (np.arange(total, dtype=np.int64) * self.scale + self.offset) % self.prime
        rows = np.full((len(self), self.width), self.junk, dtype=np.int32)
        needed = np.arange(self.width) < np.asarray(self.pages_needed)[:, None]
        rows[needed] = pages  # row-major order: row r's k run on from row r - 1's
        return rows


BlockTable = Union[tuple[tuple[int, ...], ...], PermutedBlockTable]


@dataclass(frozen=True)
class Batch:
    """The arguments of one ``build_c128a_topk_metadata`` call, engine-shaped.

    Tokens are ordered decode first, then prefill. ``block_table`` holds the
    rows of decode requests only, explicitly or as a
    :class:`PermutedBlockTable`; it is passed as the first ``len(row)``
    columns of a table whose row stride is ``block_table_row_stride`` (a slice
    of a wider table, as vLLM passes it). The prefill buffer may be
    ``prefill_extra_columns`` wider than the decode buffer (another row
    stride). ``slot_mapping`` may be longer than
    T; negative entries mark CUDA-graph padding tokens.
    """

    positions: tuple[int, ...]
    num_decode_tokens: int
    token_to_req_indices: tuple[int, ...]
    block_table: BlockTable
    slot_mapping: tuple[int, ...]
    max_model_len: int
    capacity: int
    width: int
    buffer_rows: int
    block_table_row_stride: int = 0  # 0: dense, the table's own width
    prefill_extra_columns: int = 0  # the prefill buffer is this much wider than C
    compress_ratio: int = policy.COMPRESS_RATIO
    block_size: int = 2
    table_junk: int = -7  # fills the table's columns past its width
    labels: tuple[str, ...] = field(default=(), compare=False)

    @property
    def num_tokens(self) -> int:
        return len(self.positions)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens

    @property
    def table_width(self) -> int:
        if isinstance(self.block_table, PermutedBlockTable):
            return self.block_table.width if self.block_table else 0
        return len(self.block_table[0]) if self.block_table else 0

    @property
    def max_seq_len(self) -> int:
        """Longest sequence seen by the batch: last position + 1."""
        return max(self.positions, default=-1) + 1

    def validate(self) -> None:
        """Raise :class:`~c128a.validation.InvalidArgument` unless this step,
        as the builder's arguments, is inside the contract (checked on the CPU)."""
        from .validation import check_build_arguments

        tensors, buffers = self.tensors("cpu"), Buffers.for_batch(self, "cpu")
        call_builder(check_build_arguments, self, tensors, buffers, self.width)

    def with_width(self, width: int) -> "Batch":
        return dataclasses.replace(self, width=width)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["block_table"] = [list(row) for row in self.block_table]
        for key in ("positions", "token_to_req_indices", "slot_mapping", "labels"):
            data[key] = list(data[key])
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Batch":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise KeyError(f"unknown Batch field(s): {', '.join(unknown)}")
        values = dict(data)
        values["block_table"] = tuple(tuple(int(v) for v in row) for row in data["block_table"])
        for key in ("positions", "token_to_req_indices", "slot_mapping", "labels"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    def tensors(self, device: torch.device | str) -> "BatchTensors":
        """The builder's tensor arguments on ``device``: int64 positions and
        slots, int32 request indices, and the block table as the first
        ``table_width`` columns of a table whose row stride is
        ``block_table_row_stride``, its other columns holding ``table_junk``.

        Packed on the host and moved with one host-to-device copy (a few
        copies and kernel launches per build were most of an example's
        device-side time); every argument is a view of that copy starting on
        a 16-byte boundary, as slices of an engine's persistent buffers are
        (Triton specialises on pointer alignment: views at odd offsets would
        compile other variants as T changes)."""
        rows = len(self.block_table)
        width = self.table_width
        stride = max(self.block_table_row_stride, width, 1)
        num_tokens = len(self.positions)
        num_requests = len(self.token_to_req_indices)
        wide_rows = max(rows, 1)
        # array() converts a flat sequence of Python ints in C, far faster
        # than torch.tensor on nested tuples; it raises OverflowError for a
        # value outside the dtype, as torch.tensor does.
        longs = array("q", self.positions)
        longs.extend([0] * (-num_tokens % 2))
        slots_start = len(longs)
        longs.extend(self.slot_mapping)
        longs.extend([0] * (-len(longs) % 2))
        ints = array("i", self.token_to_req_indices)
        ints.extend([0] * (-num_requests % 4))
        table_start = len(ints)
        if not isinstance(self.block_table, PermutedBlockTable):
            junk = [self.table_junk] * (stride - width)
            for row in self.block_table:
                ints.extend(row)
                ints.extend(junk)
            ints.extend([self.table_junk] * ((wide_rows - rows) * stride))
        packed = bytearray(longs)
        split = len(packed)
        packed += ints
        if isinstance(self.block_table, PermutedBlockTable):
            packed += _permuted_table_bytes(self.block_table, wide_rows, stride, self.table_junk)
        on_device = torch.frombuffer(packed, dtype=torch.uint8).to(device, copy=True)
        longs_device = on_device[:split].view(torch.int64)
        ints_device = on_device[split:].view(torch.int32)
        wide = ints_device[table_start:].view(wide_rows, stride)
        return BatchTensors(
            positions=longs_device[:num_tokens],
            token_to_req_indices=ints_device[:num_requests],
            block_table=wide[:rows, :width],
            slot_mapping=longs_device[slots_start : slots_start + len(self.slot_mapping)],
        )


# The latest PermutedBlockTable's rows as bytes: a property builds the same
# batch for the target and again for the oracle.
_latest_table: list = [None, b""]  # [(table, rows, stride, junk), bytes]


def _permuted_table_bytes(table: PermutedBlockTable, rows: int, stride: int, junk: int) -> bytes:
    key = (table, rows, stride, junk)
    cached_key, cached = _latest_table
    if cached_key is None or cached_key[0] is not table or cached_key[1:] != key[1:]:
        wide = np.full((rows, stride), junk, dtype=np.int32)
        if len(table):
            wide[: len(table), : table.width] = table.array()
        cached = wide.tobytes()
        _latest_table[:] = [key, cached]
    return cached


@dataclass
class BatchTensors:
    positions: torch.Tensor
    token_to_req_indices: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


@dataclass
class Buffers:
    """The persistent buffers: [rows, capacity] decode and prefill, [rows] lens."""

    global_decode: torch.Tensor
    decode_lens: torch.Tensor
    prefill: torch.Tensor

    @classmethod
    def allocate(
        cls,
        rows: int,
        capacity: int,
        device: torch.device | str,
        fill: int = POISON,
        *,
        prefill_capacity: int | None = None,
    ) -> "Buffers":
        prefill_capacity = capacity if prefill_capacity is None else prefill_capacity
        return cls(
            global_decode=torch.full((rows, capacity), fill, dtype=torch.int32, device=device),
            decode_lens=torch.full((rows,), fill, dtype=torch.int32, device=device),
            prefill=torch.full((rows, prefill_capacity), fill, dtype=torch.int32, device=device),
        )

    @classmethod
    def for_batch(cls, batch: "Batch", device: torch.device | str, fill: int = POISON) -> "Buffers":
        """The persistent buffers ``batch`` describes, filled with ``fill``."""
        return cls.allocate(
            batch.buffer_rows,
            batch.capacity,
            device,
            fill,
            prefill_capacity=batch.capacity + batch.prefill_extra_columns,
        )

    def clone(self) -> "Buffers":
        return Buffers(self.global_decode.clone(), self.decode_lens.clone(), self.prefill.clone())

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.global_decode, self.decode_lens, self.prefill


@dataclass
class BuildResult:
    """What a build returned and the buffers it wrote into."""

    batch: Batch
    width: int
    views: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    buffers: Buffers


def call_builder(builder, batch: Batch, tensors: BatchTensors, buffers: Buffers, width: int):
    """Call a ``build_c128a_topk_metadata`` with vLLM's argument order."""
    return builder(
        tensors.positions,
        batch.compress_ratio,
        batch.num_decode_tokens,
        tensors.token_to_req_indices,
        tensors.block_table,
        batch.block_size,
        tensors.slot_mapping,
        buffers.global_decode,
        buffers.decode_lens,
        buffers.prefill,
        width,
    )


def build(
    builder,
    batch: Batch,
    device: torch.device | str,
    *,
    width: int | None = None,
    buffers: Buffers | None = None,
) -> BuildResult:
    """Run ``builder`` on ``batch`` at ``width`` (the batch's own by default)
    into ``buffers`` (fresh, poisoned with :data:`POISON`, by default)."""
    width = batch.width if width is None else width
    if buffers is None:
        buffers = Buffers.for_batch(batch, device)
    views = call_builder(builder, batch, batch.tensors(device), buffers, width)
    return BuildResult(batch=batch, width=width, views=tuple(views), buffers=buffers)
