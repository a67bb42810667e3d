"""Where a step's inputs live, and the check that a build leaves them as it found them.

An engine hands the builder slices of its persistent input tensors
(``positions``, ``token_to_req_indices``, ``slot_mapping``, the block
table): views at a storage offset, 16-byte aligned or not (Triton keys a
pointer argument on 16-byte alignment, so an unaligned slice is another
compiled variant and another code path). :class:`InputPlacement` records,
per input, how many elements of its persistent tensor come before the
step's slice; :class:`InputLayout` places the four persistent tensors in
the one host-to-device copy :meth:`~c128a.step.Batch.tensors` makes, each
with :data:`INPUT_CANARY` in the elements around the slice.

Other kernels of the step read the same tensors after the builder, and
CONTRACT.md lets a build change nothing outside its written region:
:func:`check_inputs_unchanged` compares the whole copy (slices, the
persistent tensors' other elements, the padding between them) after a
build with what was uploaded, and names the first element a build wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch

from ..failures import InvariantViolation
from .buffers import to_host
from .schema import Range

INPUT_ALIGNMENT = 16
"""Bytes Triton keys a pointer argument on: an input whose address is a
multiple of this is "aligned"."""

INPUT_CANARY = -55
"""What every element of a persistent input tensor outside the step's slice
holds (another request's stale entry, as far as a build may tell): a build
that reads it or writes it shows."""

INPUT_TAIL = 8
"""Elements of each persistent input tensor after the step's slice (the
rest of the engine's ``max_num_batched_tokens`` entries, or the other
requests' block-table rows)."""

MAX_INPUT_OFFSET = 1 << 16
"""The most elements of a persistent input tensor before the step's slice."""

INPUT_NAMES = ("positions", "token_to_req_indices", "slot_mapping", "block_table")
"""The builder's tensor inputs, in vLLM's argument order."""

Offset = Annotated[int, Range(0, MAX_INPUT_OFFSET)]


@dataclass(frozen=True)
class InputPlacement:
    """Elements of each input's persistent tensor before the step's slice
    (its storage offset there): 0 for all four is each input at the start of
    a tensor of its own, 16-byte aligned (what every step had before
    placements were drawn). ``block_table`` counts elements of the wider
    table the step's rows are sliced from (rows of other requests, or
    columns: any offset).

    Each field's annotation is its JSON schema (:mod:`c128a.step.schema`)."""

    positions: Offset = 0
    token_to_req_indices: Offset = 0
    slot_mapping: Offset = 0
    block_table: Offset = 0

    @property
    def fresh(self) -> bool:
        return self == InputPlacement()

    def offset(self, name: str) -> int:
        return getattr(self, name)

    def aligned(self, name: str) -> bool:
        """Whether input ``name`` starts on a 16-byte boundary."""
        return self.offset(name) * ITEM_BYTES[name] % INPUT_ALIGNMENT == 0


ITEM_BYTES = {"positions": 8, "token_to_req_indices": 4, "slot_mapping": 8, "block_table": 4}
DTYPES = {"positions": np.int64, "token_to_req_indices": np.int32, "slot_mapping": np.int64,
          "block_table": np.int32}
PACK_ORDER = ("positions", "slot_mapping", "token_to_req_indices", "block_table")
"""The order of the persistent tensors in the copy: the int64 ones first."""


@dataclass(frozen=True)
class Region:
    """One persistent input tensor in the copy: from byte ``start``,
    ``offset`` canaries, the step's ``extent`` elements (for the block
    table, its rows at the wider table's row stride), :data:`INPUT_TAIL`
    canaries."""

    name: str
    start: int
    offset: int
    extent: int

    @property
    def item(self) -> int:
        return ITEM_BYTES[self.name]

    @property
    def elements(self) -> int:
        return self.offset + self.extent + INPUT_TAIL

    @property
    def stop(self) -> int:
        return self.start + self.elements * self.item


@dataclass(frozen=True)
class InputLayout:
    """The four persistent input tensors in one byte buffer, each starting
    on a 16-byte boundary; ``table`` is (rows, columns, row stride, rows of
    the wider table) of the block table."""

    regions: tuple[Region, ...]
    table: tuple[int, int, int, int]

    @classmethod
    def of(cls, placement: InputPlacement, extents: dict[str, int],
           table: tuple[int, int, int, int]) -> "InputLayout":
        regions, start = [], 0
        for name in PACK_ORDER:
            region = Region(name, start, placement.offset(name), extents[name])
            regions.append(region)
            start = -(-region.stop // INPUT_ALIGNMENT) * INPUT_ALIGNMENT
        return cls(tuple(regions), table)

    @property
    def size(self) -> int:
        return -(-self.regions[-1].stop // INPUT_ALIGNMENT) * INPUT_ALIGNMENT

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)

    def pack(self, values: dict[str, bytes]) -> np.ndarray:
        """The byte buffer: each region's canaries, then ``values[name]``
        (its extent's bytes), then canaries; zeros between regions."""
        packed = np.zeros(self.size, dtype=np.uint8)
        for region in self.regions:
            elements = packed[region.start : region.stop].view(DTYPES[region.name])
            elements[:] = INPUT_CANARY
            data = np.frombuffer(values[region.name], dtype=DTYPES[region.name])
            elements[region.offset : region.offset + region.extent] = data
        return packed

    def describe(self, byte: int) -> str:
        """The input element byte ``byte`` of the copy lies in, in words."""
        for region in self.regions:
            if not region.start <= byte < region.stop:
                continue
            element = (byte - region.start) // region.item
            inside = element - region.offset
            if inside < 0:
                return (f"element {element} of the persistent {region.name} tensor, before "
                        f"the step's slice (which starts at its element {region.offset})")
            if inside >= region.extent:
                return (f"element {element} of the persistent {region.name} tensor, after "
                        f"the step's slice (its elements {region.offset} to "
                        f"{region.offset + region.extent - 1})")
            if region.name != "block_table":
                return f"{region.name}[{inside}]"
            rows, columns, stride, _ = self.table
            row, column = divmod(inside, stride)
            if row < rows and column < columns:
                return f"block_table[{row}, {column}]"
            return (f"the wider block table's row {row}, column {column} (past the step's "
                    f"{rows} rows x {columns} columns, row stride {stride})")
        return f"byte {byte} of the padding between the persistent input tensors"


@dataclass
class InputMemory:
    """The inputs as uploaded: the copy on the device (``device``, which the
    builder's arguments are views of), what was uploaded (``host``), and
    where each input sits in it (``layout``)."""

    device: torch.Tensor
    host: torch.Tensor
    layout: InputLayout

    def value(self, memory: torch.Tensor, byte: int) -> int:
        """The value of the input element holding byte ``byte`` of ``memory``."""
        for region in self.layout.regions:
            if region.start <= byte < region.stop:
                first = region.start + (byte - region.start) // region.item * region.item
                return int(memory[first : first + region.item].view(
                    torch.int64 if region.item == 8 else torch.int32)[0])
        return int(memory[byte])


def check_inputs_unchanged(memory: InputMemory | None, setting: str = "") -> None:
    """Invariant: a build leaves its inputs as it found them: every byte of
    the persistent input tensors (the step's slices and the elements around
    them) still holds what was uploaded. Raises
    :class:`~c128a.failures.InvariantViolation` naming the first changed
    element (input, index, value before and after) and how many changed;
    ``setting`` (the step's W, T, ...) ends the message."""
    if memory is None:
        return
    (now,) = to_host([memory.device])
    if torch.equal(now, memory.host):
        return
    changed = torch.nonzero(now != memory.host).flatten()
    first = int(changed[0])
    count, outside = 0, torch.ones_like(changed, dtype=torch.bool)
    for region in memory.layout.regions:
        inside = (changed >= region.start) & (changed < region.stop)
        outside &= ~inside
        count += torch.unique((changed[inside] - region.start) // region.item).numel()
    count += int(outside.sum())
    raise InvariantViolation(
        "inputs_unchanged",
        f"the build wrote its inputs: {memory.layout.describe(first)} changed from "
        f"{memory.value(memory.host, first)} to {memory.value(now, first)}; {count} input "
        "element(s) changed. The inputs are the engine's persistent tensors, which other "
        "kernels of the step read after the builder: nothing outside the written region "
        "may change (CONTRACT.md)" + (f"; {setting}" if setting else ""),
    )
