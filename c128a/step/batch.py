"""One engine step's input to the builder, as plain data.

A :class:`Batch` holds only ints and lists of ints, so it prints readably when
Hypothesis shrinks a failure and serialises to JSON as a regression case.
:func:`assemble_batch` is the one way a step is put together from its
requests; :meth:`Batch.tensors` turns it into the builder's tensors on a
device, and :meth:`Batch.build_args` into the builder's arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Union

import numpy as np
import torch

from ..contract import (
    BLOCK_SIZE,
    COMPRESS_RATIO,
    SLOTS,
    WIDTH_ALIGNMENT,
    BuildArgs,
    check_build_arguments,
)
from .. import phases
from ..failures import BadArgument, CaseError
from . import schema
from .buffers import BufferLayout, Buffers, upload
from .inputs import InputLayout, InputMemory, InputPlacement
from .prior import PriorStep
from .schema import Int32, Int64, Range

PAGE_PRIME = 1_000_003
"""Page numbers are an affine permutation modulo this prime: unique, shuffled,
and small enough that ``page * block_size`` fits in int32 up to B = 2,147
(:func:`page_modulus` picks a smaller one for larger block sizes)."""

INT32_MAX = 2**31 - 1


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (the first 12 primes as bases)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@functools.lru_cache(maxsize=256)
def page_modulus(block_size: int, pages: int = 0) -> int:
    """The prime page numbers are permuted modulo for a table of ``pages``
    pages at ``block_size``: :data:`PAGE_PRIME` where every slot id
    ``page * B + j % B`` fits in int32 and the pages fit, else the largest
    prime that keeps slot ids in int32 (a block size of 65,536 leaves 32,749
    page numbers). Raises BadArgument when the pages cannot all be unique."""
    if pages <= PAGE_PRIME and PAGE_PRIME * block_size <= INT32_MAX:
        return PAGE_PRIME
    candidate = INT32_MAX // block_size - 1
    while candidate >= 2 and not _is_prime(candidate):
        candidate -= 1
    if candidate < max(pages, 2):
        raise BadArgument(
            f"{pages:,} unique pages at block_size={block_size} do not fit int32 slot ids"
        )
    return candidate

MAX_BUFFER_ROWS = 65_536
"""The most rows a step's buffers may have: 8x the contract's typical
``max_num_batched_tokens`` of 8,192."""

MAX_BUFFER_ELEMENTS = 1 << 26
"""The most elements one persistent buffer may have (256 MiB of int32: an
8,192 x 8,192 buffer, the typical token budget at 1M context). Checked before
a case's buffers are allocated."""

MAX_TABLE_ELEMENTS = 1 << 24
"""The most block-table entries a saved step may have."""

MAX_BUFFER_GAP = 1 << 16
"""The most elements a buffer may start into its allocation (and lie apart
from the next buffer in a pool)."""

MAX_CASE_MODEL_LEN = 1 << 26
"""The longest ``max_model_len`` a saved step may have. The contract allows
any; past the engine's 1M (``c128a.contract.MAX_MODEL_LEN``) the
strategies draw a few tokens at a time (positions at and past 2^20)."""

MAX_CASE_CAPACITY = 1 << 16
"""The widest capacity C a saved step may have: past the engine's 8,192
(``c128a.contract.MAX_CAPACITY``; R = 64 at 1M gives 16,384), within
:data:`MAX_BUFFER_ELEMENTS` for a few rows."""


@dataclass(frozen=True, eq=False)
class PermutedBlockTable(Sequence):
    """Block-table rows of unique, shuffled page numbers, held as the few ints
    that describe them.

    Row ``r`` holds ``pages_needed[r]`` pages ``(scale * k + offset) % prime``
    for consecutive ``k`` (counting on from the previous row), then ``junk``
    up to ``width`` columns. With ``shared`` the first ``shared`` pages
    (``k`` < ``shared``) lead every row, as prefix caching shares a prompt's
    pages among requests: row ``r``'s first min(``shared``, need) columns
    hold them, its other needed columns count on from the previous row's
    (``offset`` 0 makes the shared prefix start at page 0, vLLM's null
    block). It is a sequence of row tuples like the explicit
    form (rows materialise when indexed, and it equals the explicit table it
    describes), but :meth:`Batch.tensors` builds it with a few array ops: a
    1M-context step's table holds hundreds of thousands of entries, too many
    to handle one Python int at a time on every example.
    """

    pages_needed: tuple[Annotated[int, Range(0, 1 << 24)], ...]
    width: Annotated[int, Range(0, 1 << 24)]
    scale: Annotated[int, Range(1, INT32_MAX)] = 1
    offset: Annotated[int, Range(0, INT32_MAX)] = 0
    junk: Int32 = -7
    prime: Annotated[int, Range(2, INT32_MAX)] = PAGE_PRIME
    shared: Annotated[int, Range(0, 1 << 24)] = 0

    def __post_init__(self):
        if self.pages_needed and max(self.pages_needed) < 0:
            raise BadArgument(f"pages_needed={self.pages_needed!r:.60} must be >= 0")
        if self.unique_pages > self.prime:
            raise BadArgument(
                f"{self.unique_pages:,} pages do not fit prime={self.prime:,}: they "
                "would repeat"
            )
        if self.width < max(self.pages_needed, default=0):
            raise BadArgument(
                f"width={self.width} < the largest row need {max(self.pages_needed)}"
            )

    @property
    def unique_pages(self) -> int:
        """Pages of the table's rows, each shared page counted once."""
        return self.shared + sum(max(need - self.shared, 0) for need in self.pages_needed)

    @functools.cached_property
    def _first_pages(self) -> tuple[int, ...]:
        """Per row, the ``k`` of its first page past the shared ones."""
        own = (max(need - self.shared, 0) for need in self.pages_needed)
        return tuple(itertools.accumulate(own, initial=self.shared))

    def _ks(self, row: int) -> range | list[int]:
        """The ``k`` of row ``row``'s needed pages, in column order."""
        first, need = self._first_pages[row], self.pages_needed[row]
        if not self.shared:
            return range(first, first + need)
        leading = min(need, self.shared)
        return [*range(leading), *range(first, first + need - leading)]

    def __len__(self) -> int:
        return len(self.pages_needed)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        row = range(len(self))[index]  # IndexError and negative indices as a tuple's
        pages = tuple((self.scale * k + self.offset) % self.prime for k in self._ks(row))
        return pages + (self.junk,) * (self.width - self.pages_needed[row])

    def __eq__(self, other) -> bool:
        if isinstance(other, PermutedBlockTable):
            if dataclasses.astuple(self) == dataclasses.astuple(other):
                return True
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def to_json(self) -> dict[str, Any]:
        """The description itself: a table of an engine-scale step (hundreds
        of requests, thousands of pages each) stays a few numbers in a case.
        ``shared`` is left out where 0: a table without shared pages writes
        what it wrote before (case names and seeds stay the same)."""
        data = {f.name: list(v) if isinstance(v, tuple) else v
                for f in dataclasses.fields(self) for v in (getattr(self, f.name),)}
        if not self.shared:
            del data["shared"]
        return data

    def array(self) -> np.ndarray:
        """The rows as an int32 array [len(self), width]. Only the needed
        entries go through the modulo, in one flat pass: the junk half of a
        table costs a fill, not arithmetic."""
        rows = np.full((len(self), self.width), self.junk, dtype=np.int32)
        if not len(self):
            return rows
        needs = np.asarray(self.pages_needed, dtype=np.int64)
        columns = np.arange(self.width, dtype=np.int64)
        needed = columns < needs[:, None]
        # Row r's column c: a shared page k = c below ``shared``, else its
        # own pages counting on from the previous row's (row-major order).
        own = np.asarray(self._first_pages[:-1], dtype=np.int64)[:, None] + columns - self.shared
        ks = np.where(columns < self.shared, columns, own)
        rows[needed] = (ks[needed] * self.scale + self.offset) % self.prime
        return rows


BlockTable = Union[tuple[tuple[int, ...], ...], PermutedBlockTable]

Count = Annotated[int, Range(0, MAX_BUFFER_ROWS)]
Size = Annotated[int, Range(1, 1 << 16)]


@dataclass(frozen=True)
class Batch:
    """The arguments of one ``build_c128a_topk_metadata`` call, engine-shaped.

    Tokens are ordered decode first, then prefill. ``block_table`` holds the
    rows of decode requests only, explicitly or as a
    :class:`PermutedBlockTable`; it is passed as the first ``len(row)``
    columns of a table whose row stride is ``block_table_row_stride`` (a slice
    of a wider table, as vLLM passes it). The prefill buffer may be
    ``prefill_extra_columns`` wider than the decode buffer (another row
    stride; negative: narrower, the decode buffer the wider). ``slot_mapping``
    may be longer than T; negative entries mark CUDA-graph padding tokens.
    ``inputs`` places each tensor input inside a larger persistent tensor
    (:class:`~c128a.step.inputs.InputPlacement`).

    Each field's annotation is its JSON schema (:mod:`c128a.step.schema`).
    """

    positions: tuple[Int64, ...]
    num_decode_tokens: Count
    token_to_req_indices: tuple[Int32, ...]
    block_table: BlockTable
    slot_mapping: tuple[Int64, ...]
    max_model_len: Annotated[int, Range(1, MAX_CASE_MODEL_LEN)]
    capacity: Annotated[int, Range(1, MAX_CASE_CAPACITY)]
    width: Int32
    buffer_rows: Annotated[int, Range(1, MAX_BUFFER_ROWS)]
    block_table_row_stride: Annotated[int, Range(0, 4 * MAX_CASE_CAPACITY)] = 0  # 0: dense
    # The prefill buffer's columns past the decode buffer's (negative: fewer).
    prefill_extra_columns: Annotated[int, Range(-MAX_CASE_CAPACITY, MAX_CASE_CAPACITY)] = 0
    compress_ratio: Size = COMPRESS_RATIO
    block_size: Size = BLOCK_SIZE
    table_junk: Int32 = -7  # fills the table's columns past its width
    # Where the persistent buffers sit (BufferLayout): 0, 0, False is three
    # fresh contiguous allocations.
    buffer_offset: Annotated[int, Range(0, MAX_BUFFER_GAP)] = 0
    buffer_row_padding: Annotated[int, Range(0, MAX_CASE_CAPACITY)] = 0
    buffer_pooled: bool = False
    # The width of the step history_independent builds into the buffers
    # before this one (0: the widest the buffers allow).
    prior_width: Annotated[int, Range(0, MAX_CASE_CAPACITY)] = 0
    # The shape of that earlier step where it differs from this one's (None:
    # the same rows, R, B and placement, as before shape histories existed).
    prior: PriorStep | None = None
    # Where each tensor input sits in its persistent tensor (the default:
    # each at the start of its own, as before placements were drawn).
    inputs: InputPlacement = InputPlacement()
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
        """Longest sequence of the step's requests, last position + 1, over
        tokens with a slot (>= 0): a padding token's stale position is no
        request's, as in the engine, whose ``max_seq_len`` comes from its requests."""
        slots = self.slot_mapping
        return max((p for p, s in zip(self.positions, slots) if s >= 0), default=-1) + 1

    @property
    def widest_width(self) -> int:
        """The widest W the step's buffers allow: the largest multiple of 128
        that fits both the decode buffer (C columns) and the prefill buffer
        (C plus ``prefill_extra_columns``), so C itself for every capacity
        the contract knows; the step's own W if no multiple fits."""
        columns = min(self.capacity, self.capacity + self.prefill_extra_columns)
        widest = columns // WIDTH_ALIGNMENT * WIDTH_ALIGNMENT
        return widest if widest >= max(self.width, 1) else self.width

    @property
    def earlier_width(self) -> int:
        """The width of the step built into these buffers before this one
        (``history_independent``): ``prior_width``, or the widest its buffers
        allow (at a reused address, :attr:`PriorStep.columns`, no wider
        than those columns)."""
        if self.prior_width:
            return self.prior_width
        columns = self.prior.columns if self.prior is not None else 0
        if columns >= WIDTH_ALIGNMENT:
            return min(self.widest_width, columns // WIDTH_ALIGNMENT * WIDTH_ALIGNMENT)
        return self.widest_width

    def rows_at_columns(self, columns: int, row_offset: int = 0) -> int:
        """Rows of ``columns`` dense columns that fit in either 2-D buffer's
        memory from its row ``row_offset`` to the end of its last row (the
        earlier step's buffers at a reused address, :class:`PriorStep`)."""
        fits = []
        for width in (self.capacity, self.capacity + self.prefill_extra_columns):
            stride = width + self.buffer_row_padding
            rows = self.buffer_rows - row_offset
            fits.append(((rows - 1) * stride + width) // columns if rows > 0 else 0)
        return min(fits)

    @property
    def buffer_layout(self) -> BufferLayout:
        return BufferLayout(self.buffer_offset, self.buffer_row_padding, self.buffer_pooled)

    def with_width(self, width: int) -> "Batch":
        return dataclasses.replace(self, width=width)

    def validate(self, padding_rows: str = SLOTS) -> None:
        """Raise :class:`~c128a.failures.BadArgument` unless this step, as the
        builder's arguments, is inside the contract under the ``padding_rows``
        variant (checked on the CPU)."""
        args = self.build_args(self.tensors("cpu"), Buffers.for_batch(self, "cpu"))
        check_build_arguments(args, padding_rows)

    def check_sizes(self, path=None, where: str = "batch") -> None:
        """Refuse, before anything is allocated, a step whose buffers or block
        table would be larger than the suite ever builds (:class:`CaseError`)."""
        if self.capacity + self.prefill_extra_columns < 1:
            raise CaseError(path, f"{where}.prefill_extra_columns",
                            f"capacity + prefill_extra_columns = "
                            f"{self.capacity + self.prefill_extra_columns} must be >= 1: the "
                            "prefill buffer needs a column")
        row = (self.capacity + max(self.prefill_extra_columns, 0)) + self.buffer_row_padding
        checks = (
            ("buffer_rows", self.buffer_rows * row, MAX_BUFFER_ELEMENTS,
             "buffer_rows x (the wider buffer's columns + buffer_row_padding)"),
            ("block_table",
             len(self.block_table) * max(self.block_table_row_stride, self.table_width, 1),
             MAX_TABLE_ELEMENTS, "rows x row stride"),
        )
        for name, size, limit, what in checks:
            if size > limit:
                raise CaseError(path, f"{where}.{name}", f"{what} = {size:,} exceeds {limit:,}")
        for name in ("positions", "token_to_req_indices", "slot_mapping"):
            if len(getattr(self, name)) > MAX_BUFFER_ROWS + 64:
                raise CaseError(path, f"{where}.{name}", f"more than {MAX_BUFFER_ROWS + 64:,} entries")
        if self.prior is not None and self.prior.rows_needed > self.buffer_rows:
            raise CaseError(
                path, f"{where}.prior",
                f"row_offset + max(num_decode_tokens, num_prefill_tokens) = "
                f"{self.prior.rows_needed} exceeds buffer_rows={self.buffer_rows}: the earlier "
                "step is built into this step's buffers",
            )
        if self.prior is not None and self.prior.columns:
            fits = self.rows_at_columns(self.prior.columns, self.prior.row_offset)
            needed = max(self.prior.num_decode_tokens, self.prior.num_prefill_tokens)
            if needed > fits or self.earlier_width > self.prior.columns:
                raise CaseError(
                    path, f"{where}.prior.columns",
                    f"columns={self.prior.columns} holds {fits} rows of either buffer from row "
                    f"{self.prior.row_offset}, and the earlier step needs {needed} rows at "
                    f"W={self.earlier_width}: the earlier step's rows and width must fit its "
                    "buffers at that geometry",
                )

    # ---------------------------------------------------------------- JSON

    def to_json(self) -> dict[str, Any]:
        """Every field, tuples as lists and the block table as explicit rows.
        Field by field rather than ``dataclasses.asdict``, which deep-copies
        the table's description only to have it replaced; a fuzz worker
        writes this before every example."""
        data = {
            f.name: list(value) if isinstance(value, tuple) else value
            for f in dataclasses.fields(self)
            for value in (getattr(self, f.name),)
        }
        table = self.block_table
        if isinstance(table, PermutedBlockTable):
            data["block_table"] = table.to_json()
        else:
            data["block_table"] = [list(row) for row in table]
        if self.prior is None:
            # A step without a shape history writes what it wrote before, so
            # its case names and history_independent's seed stay the same.
            del data["prior"]
        else:
            data["prior"] = schema.to_json(self.prior)
        if self.inputs.fresh:
            del data["inputs"]  # the same for a step with its inputs at offset 0
        else:
            data["inputs"] = dataclasses.asdict(self.inputs)
        return data

    @classmethod
    def from_json(cls, data: Any, path=None, where: str = "batch") -> "Batch":
        """A Batch from its JSON, every field checked against its annotation
        and the sizes bounded (:class:`CaseError`), before anything is built."""
        batch = schema.from_json(
            cls, data, path, where, {"block_table": _read_block_table, "prior": _read_prior}
        )
        batch.check_sizes(path, where)
        batch.check_prior_width(path, where)
        return batch

    def check_prior_width(self, path=None, where: str = "batch") -> None:
        """Refuse a ``prior_width`` the builder would refuse (:class:`CaseError`):
        the step built before this one is the suite's setup, so a width
        outside the contract there is a fault of the case, never the target's."""
        width = self.prior_width
        # The step's own width is judged with the step (outside_contract may excuse it).
        if width and width != self.width and (
            width % WIDTH_ALIGNMENT or width > self.widest_width
        ):
            raise CaseError(
                path, f"{where}.prior_width",
                f"prior_width={width} must be 0 (the widest width the buffers allow), the "
                f"step's own width={self.width}, or a multiple of {WIDTH_ALIGNMENT} up to "
                f"widest_width={self.widest_width} (what capacity={self.capacity} and "
                f"prefill_extra_columns={self.prefill_extra_columns} allow): the earlier step "
                f"history_independent builds must be one the builder accepts; give a multiple "
                f"of {WIDTH_ALIGNMENT} in range, or 0"
            )

    # ---------------------------------------------------------------- tensors

    @phases.measured("tensors")
    def tensors(self, device: torch.device | str) -> "BatchTensors":
        """The builder's tensor arguments on ``device``: int64 positions and
        slots, int32 request indices, and the block table as the first
        ``table_width`` columns of a table whose row stride is
        ``block_table_row_stride``, its other columns holding ``table_junk``.

        Each is a slice of a persistent tensor of its own, ``inputs``
        elements into it (:class:`~c128a.step.inputs.InputPlacement`), the
        rest of which holds :data:`~c128a.step.inputs.INPUT_CANARY`. All four
        are packed on the host and moved with one host-to-device copy (a few
        copies and kernel launches per build were most of an example's
        device-side time); each persistent tensor starts on a 16-byte
        boundary, as an allocator hands them out, so an input is unaligned
        exactly where its placement puts it off one (Triton specialises on
        pointer alignment). ``memory`` is that copy, for
        :func:`~c128a.step.inputs.check_inputs_unchanged`."""
        rows = len(self.block_table)
        width = self.table_width
        stride = max(self.block_table_row_stride, width, 1)
        wide_rows = max(rows, 1)
        # array() converts a flat sequence of Python ints in C, far faster
        # than torch.tensor on nested tuples; it raises OverflowError for a
        # value outside the dtype, as torch.tensor does.
        values = {
            "positions": array("q", self.positions).tobytes(),
            "slot_mapping": array("q", self.slot_mapping).tobytes(),
            "token_to_req_indices": array("i", self.token_to_req_indices).tobytes(),
        }
        if isinstance(self.block_table, PermutedBlockTable):
            values["block_table"] = _permuted_table_bytes(
                self.block_table, wide_rows, stride, self.table_junk)
        else:
            table = array("i")
            junk = [self.table_junk] * (stride - width)
            for row in self.block_table:
                table.extend(row)
                table.extend(junk)
            table.extend([self.table_junk] * ((wide_rows - rows) * stride))
            values["block_table"] = table.tobytes()
        extents = {
            "positions": len(self.positions), "slot_mapping": len(self.slot_mapping),
            "token_to_req_indices": len(self.token_to_req_indices),
            "block_table": wide_rows * stride,
        }
        layout = InputLayout.of(self.inputs, extents, (rows, width, stride, wide_rows))
        host = torch.from_numpy(layout.pack(values))
        on_device = upload(host, device)
        views = {}
        for region in layout.regions:
            dtype = torch.int64 if region.item == 8 else torch.int32
            elements = on_device[region.start : region.stop].view(dtype)
            views[region.name] = elements[region.offset : region.offset + region.extent]
        wide = views["block_table"].view(wide_rows, stride)
        return BatchTensors(
            positions=views["positions"],
            token_to_req_indices=views["token_to_req_indices"],
            block_table=wide[:rows, :width],
            slot_mapping=views["slot_mapping"],
            memory=InputMemory(on_device, host, layout),
        )

    def build_args(
        self, tensors: "BatchTensors", buffers: Buffers, width: int | None = None
    ) -> BuildArgs:
        """The builder's arguments: this step's ``tensors`` and scalars, the
        persistent ``buffers``, at ``width`` (the step's own by default)."""
        return BuildArgs(
            positions=tensors.positions,
            compress_ratio=self.compress_ratio,
            num_decode_tokens=self.num_decode_tokens,
            token_to_req_indices=tensors.token_to_req_indices,
            block_table=tensors.block_table,
            block_size=self.block_size,
            slot_mapping=tensors.slot_mapping,
            global_decode_buffer=buffers.global_decode,
            decode_lens_buffer=buffers.decode_lens,
            prefill_buffer=buffers.prefill,
            max_compressed_tokens=self.width if width is None else width,
        )


def _read_block_table(value: Any, path, where: str) -> BlockTable:
    """Explicit rows (a list of lists), or a :class:`PermutedBlockTable`'s
    description (an object)."""
    if isinstance(value, dict):
        try:
            return schema.from_json(PermutedBlockTable, value, path, where)
        except BadArgument as exc:
            raise CaseError(path, where, str(exc)) from None
    rows = schema.read_value(tuple[tuple[Int32, ...], ...], value, path, where)
    if len({len(row) for row in rows}) > 1:
        raise CaseError(path, where, "rows must all have the same length")
    return rows


def _read_prior(value: Any, path, where: str) -> PriorStep | None:
    """The earlier step's shape (an object), or null."""
    return None if value is None else schema.from_json(PriorStep, value, path, where)


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
    """The builder's tensor inputs; ``memory`` the persistent tensors they
    are slices of, as uploaded (None: tensors of their own, unchecked)."""

    positions: torch.Tensor
    token_to_req_indices: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    memory: InputMemory | None = field(default=None, repr=False)


# ---------------------------------------------------------------- assembling a step


@dataclass(frozen=True)
class StepRequest:
    """One request's tokens in a step: their positions, and their slots (the
    positions themselves when None)."""

    positions: tuple[int, ...]
    slots: tuple[int, ...] | None = None

    @classmethod
    def last(cls, seq_len: int, query_len: int) -> "StepRequest":
        """The last ``query_len`` positions of a sequence of ``seq_len`` tokens."""
        return cls(tuple(range(seq_len - query_len, seq_len)))

    @property
    def seq_len(self) -> int:
        return max(self.positions, default=-1) + 1


@dataclass(frozen=True)
class PaddingToken:
    """A CUDA-graph padding token: a stale position and request, a negative slot."""

    position: int
    request: int
    slot: int = -1


def assemble_batch(
    decode: Sequence[StepRequest],
    prefill: Sequence[StepRequest] = (),
    *,
    block_table: BlockTable,
    max_model_len: int,
    capacity: int,
    width: int,
    buffer_rows: int,
    tail_padding: Sequence[PaddingToken] = (),
    padded_tokens: Mapping[int, int] | None = None,
    extra_slots: Sequence[int] = (),
    block_table_row_stride: int = 0,
    prefill_extra_columns: int = 0,
    compress_ratio: int = COMPRESS_RATIO,
    block_size: int = BLOCK_SIZE,
    buffer_layout: BufferLayout = BufferLayout(),
    prior_width: int = 0,
    labels: tuple[str, ...] = (),
) -> Batch:
    """An engine step from its requests, the one way a :class:`Batch` is put together.

    Tokens are the decode requests' (request index = block-table row, in
    order), then the prefill requests' (request indices after the decode
    rows: prefill tokens never read the table), then ``tail_padding``. Tail
    padding tokens are decode tokens when the step has no prefill request
    (a decode-only step padded to a captured size), else prefill tokens.
    ``padded_tokens`` maps real tokens to a negative slot (padding inside
    the step); ``extra_slots`` follow the T slots (``slot_mapping`` may be
    longer than T).
    """
    positions: list[int] = []
    requests: list[int] = []
    slots: list[int] = []
    for index, request in enumerate([*decode, *prefill]):
        positions += request.positions
        requests += [index] * len(request.positions)
        slots += request.slots if request.slots is not None else request.positions
    num_decode = sum(len(r.positions) for r in decode)
    for pad in tail_padding if positions else ():
        positions.append(pad.position)
        requests.append(pad.request)
        slots.append(pad.slot)
    if not prefill:
        num_decode = len(positions)
    for token, slot in (padded_tokens or {}).items():
        slots[token] = slot
    return Batch(
        positions=tuple(positions),
        num_decode_tokens=num_decode,
        token_to_req_indices=tuple(requests),
        block_table=block_table,
        slot_mapping=tuple(slots) + tuple(extra_slots),
        max_model_len=max_model_len,
        capacity=capacity,
        width=width,
        buffer_rows=buffer_rows,
        block_table_row_stride=block_table_row_stride,
        prefill_extra_columns=prefill_extra_columns,
        compress_ratio=compress_ratio,
        block_size=block_size,
        buffer_offset=buffer_layout.offset,
        buffer_row_padding=buffer_layout.row_padding,
        buffer_pooled=buffer_layout.pooled,
        prior_width=prior_width,
        labels=labels,
    )
