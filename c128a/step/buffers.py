"""The persistent buffers: their layout and allocation, copies to and from
the device, and what a build returned into them (:class:`BuildResult`).

This module knows a step only as :class:`BufferShape` describes it: the
step (:mod:`.batch`) allocates its buffers from here, and a build
(:mod:`.builds`) meets both, so the imports run one way
(pyproject.toml's importlinter contracts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from .. import phases
from ..contract import Views
from ..failures import InvariantViolation

POISON = -99
"""Fill value of every buffer before a build: anything still -99 was not written."""

POOL_ALIGNMENT = 4
"""Elements (16 bytes of int32) each buffer of a pool starts on a multiple of."""


@dataclass(frozen=True)
class BufferLayout:
    """Where the persistent buffers sit in memory, as an engine may place them:
    each 2-D buffer's rows ``row_padding`` elements apart beyond its columns
    (row stride = columns + ``row_padding``), each buffer ``offset`` elements
    into its allocation (a nonzero storage offset), and with ``pooled`` all
    three carved out of one allocation (decode rows, then prefill rows, then
    the lens, ``offset`` elements apart, each starting on a 16-byte boundary). The defaults are three fresh
    contiguous allocations. Every element of an allocation outside the
    buffers (the gaps) holds the fill too: a write there is a spill."""

    offset: int = 0
    row_padding: int = 0
    pooled: bool = False

    @property
    def fresh(self) -> bool:
        return self == BufferLayout()


class BufferShape(Protocol):
    """What the buffers need to know of a step (a :class:`~c128a.step.Batch`
    is one): how many rows, how wide, and where they sit."""

    @property
    def buffer_rows(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def prefill_extra_columns(self) -> int: ...

    @property
    def buffer_layout(self) -> BufferLayout: ...


@dataclass(frozen=True)
class _Place:
    """One buffer inside an allocation: which one, from where, how strided."""

    allocation: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass
class Buffers:
    """The persistent buffers: [rows, capacity] decode and prefill, [rows] lens.

    ``allocations`` are the tensors that own their memory when the buffers
    are views into larger ones (:class:`BufferLayout`); by default each
    buffer is its own allocation. Checks that ask what changed outside the
    written region compare the allocations, gaps included."""

    global_decode: torch.Tensor
    decode_lens: torch.Tensor
    prefill: torch.Tensor
    allocations: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)
    places: tuple[_Place, ...] | None = field(default=None, repr=False)

    @classmethod
    @phases.measured("buffers")
    def allocate(
        cls,
        rows: int,
        capacity: int,
        device: torch.device | str,
        fill: int = POISON,
        *,
        prefill_capacity: int | None = None,
        layout: BufferLayout = BufferLayout(),
    ) -> "Buffers":
        prefill_capacity = capacity if prefill_capacity is None else prefill_capacity
        if layout.fresh:
            return cls(
                global_decode=torch.full((rows, capacity), fill, dtype=torch.int32, device=device),
                decode_lens=torch.full((rows,), fill, dtype=torch.int32, device=device),
                prefill=torch.full((rows, prefill_capacity), fill, dtype=torch.int32,
                                   device=device),
            )
        gap, padding = layout.offset, layout.row_padding
        shapes = (
            ((rows, capacity), (capacity + padding, 1)),
            ((rows,), (1,)),
            ((rows, prefill_capacity), (prefill_capacity + padding, 1)),
        )
        # Decode, prefill, then lens in a pool; each its own allocation otherwise.
        order = (0, 2, 1)
        places: list[_Place | None] = [None, None, None]
        sizes: list[int] = []
        for index in order:
            shape, stride = shapes[index]
            span = shape[0] * stride[0]
            if layout.pooled and sizes:
                # Each buffer of a pool starts on a 16-byte boundary, as an
                # allocator's would (Triton keys its compiled variants on it).
                start = -(-(sizes[0] + gap) // POOL_ALIGNMENT) * POOL_ALIGNMENT
                places[index] = _Place(0, start, shape, stride)
                sizes[0] = start + span
            else:
                places[index] = _Place(len(sizes), gap, shape, stride)
                sizes.append(gap + span)
        # A gap after the last buffer of each allocation too: canaries on both sides.
        allocations = tuple(
            torch.full((size + gap,), fill, dtype=torch.int32, device=device) for size in sizes
        )
        return cls._placed(allocations, tuple(places))

    @classmethod
    def _placed(cls, allocations, places) -> "Buffers":
        views = (
            allocations[p.allocation].as_strided(p.shape, p.stride, p.offset) for p in places
        )
        return cls(*views, allocations=allocations, places=places)

    @classmethod
    def for_batch(
        cls, batch: BufferShape, device: torch.device | str, fill: int = POISON
    ) -> "Buffers":
        """The persistent buffers ``batch`` describes, filled with ``fill``."""
        return cls.allocate(
            batch.buffer_rows,
            batch.capacity,
            device,
            fill,
            prefill_capacity=batch.capacity + batch.prefill_extra_columns,
            layout=batch.buffer_layout,
        )

    @property
    def memory(self) -> tuple[torch.Tensor, ...]:
        """The allocations that hold the buffers (the buffers themselves when
        each is its own)."""
        return self.allocations if self.allocations is not None else self.as_tuple()

    def on(self, memory: Sequence[torch.Tensor]) -> "Buffers":
        """These buffers' layout placed on ``memory``, copies of :attr:`memory`."""
        if self.allocations is None:
            return Buffers(*memory)
        return Buffers._placed(tuple(memory), self.places)

    def clone(self) -> "Buffers":
        return Buffers(self.global_decode.clone(), self.decode_lens.clone(), self.prefill.clone())

    def host_copy(self) -> "Buffers":
        """A copy of the buffers on the host, in the same layout (one
        synchronisation on a GPU), to compare a later state with."""
        return self.on(to_host(self.memory, copy=True))

    def fill_(self, value: int) -> "Buffers":
        """Every element of every buffer set to ``value``, in place (same memory)."""
        for buffer in self.as_tuple():
            buffer.fill_(value)
        return self

    def copy_(self, other: "Buffers") -> "Buffers":
        """``other``'s contents copied in, in place (same memory, any device:
        :func:`copy_into`)."""
        for buffer, source in zip(self.as_tuple(), other.as_tuple()):
            copy_into(buffer, source)
        return self

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.global_decode, self.decode_lens, self.prefill


PINNED_COPY_LIMIT_BYTES = 1 << 24
"""Tensors up to this size cross between the host and a GPU through pinned
memory, without a wait; larger ones through pageable memory, each copy
waited for. torch's caching host allocator keeps every pinned block it has
handed out (rounded up to a power of two) for reuse and never returns it, so
engine-scale steps of many sizes grew each fuzz worker's pinned memory by
gigabytes until the host's out-of-memory killer ended workers."""


def through_pinned_memory(tensor: torch.Tensor) -> bool:
    """Whether a copy of ``tensor`` to or from a GPU goes through pinned memory."""
    return tensor.numel() * tensor.element_size() <= PINNED_COPY_LIMIT_BYTES


def upload(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A copy of ``host`` on ``device``; to a GPU through pinned memory and
    not waited for where it is small (a blocking copy would wait for the
    device, which many processes share). The pinned block stays reserved
    until the copy is done."""
    if torch.device(device).type == "cuda" and through_pinned_memory(host):
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device, copy=True)


def copy_into(destination: torch.Tensor, source: torch.Tensor) -> None:
    """``source`` copied into ``destination`` in place; from the host to a GPU
    through pinned memory and not waited for where it is small, as :func:`upload`."""
    if (destination.device.type == "cuda" and source.device.type == "cpu"
            and through_pinned_memory(source)):
        destination.copy_(source.pin_memory(), non_blocking=True)
    else:
        destination.copy_(source)


@phases.measured("readback")
def to_host(tensors: Sequence, *, copy: bool = False) -> list:
    """``tensors`` on the host, in order: every small device-to-host copy
    queued at once and waited for with one synchronisation (a large one is
    waited for on its own: :data:`PINNED_COPY_LIMIT_BYTES`). On a GPU shared by many
    processes each synchronisation waits for the device to come round to this
    process, so the checks read a build back once and compare on the host.
    Host tensors are returned as they are (copied with ``copy``); anything
    else (a meta tensor, a value that is not a tensor) as it is."""
    out, waits = [], set()
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            out.append(tensor)
        elif tensor.device.type == "cpu":
            out.append(tensor.clone() if copy else tensor)
        elif tensor.device.type == "cuda" and through_pinned_memory(tensor):
            # Lands in pinned memory, asynchronously; read only after the wait.
            out.append(tensor.to("cpu", non_blocking=True))
            waits.add(tensor.device)
        else:
            out.append(tensor.cpu())
    for device in waits:
        torch.cuda.current_stream(device).synchronize()
    return out


@dataclass
class BuildResult:
    """What a build returned and the buffers it wrote into; ``batch`` is the
    :class:`~c128a.step.Batch` built (:mod:`.builds` makes these).

    The checks read values from :meth:`on_host` (one read-back a build) and
    the views' geometry (storage, strides, device) from the result itself."""

    batch: Any
    width: int
    views: Views
    buffers: Buffers
    _host: "BuildResult | None" = field(default=None, repr=False, compare=False)

    def on_host(self) -> "BuildResult":
        """This result with its buffers and returned views on the host, as
        they are now: read back once (one synchronisation, cached), so take it
        before anything writes the buffers again. The result itself when it
        is on the host already."""
        if self._host is None:
            self._host = results_on_host(self)[0]
        return self._host


def results_on_host(*results: BuildResult) -> list[BuildResult]:
    """:meth:`BuildResult.on_host` of several results with one synchronisation."""
    pending = [r for r in results if r._host is None]
    tensors = [t for r in pending for t in (*r.buffers.memory, *r.views)]
    if tensors and all(
        not isinstance(t, torch.Tensor) or t.device.type in ("cpu", "meta") for t in tensors
    ):
        for result in pending:
            result._host = result
    else:
        copies = iter(to_host(tensors))
        for result in pending:
            buffers = result.buffers.on([next(copies) for _ in result.buffers.memory])
            views = Views(*(next(copies) for _ in result.views))
            result._host = BuildResult(result.batch, result.width, views, buffers)
            result._host._host = result._host
    return [r._host for r in results]


def tuple_of_views(views) -> Views:
    """A target's returned triple as :class:`~c128a.contract.Views`: three
    int32 tensors, or the ``views`` violation saying what came instead (every
    check reads them as tensors: None, a list or another dtype would fail
    inside the check's own code rather than as the target's)."""
    try:
        views = Views(*views)
    except TypeError:
        raise InvariantViolation(
            "views",
            f"build_c128a_topk_metadata returned {type(views).__name__} {views!r:.100}, not "
            "the three views (global_decode, decode_lens, prefill_local)",
        ) from None
    for name, view in views._asdict().items():
        if not isinstance(view, torch.Tensor):
            shown = repr(view) if len(repr(view)) <= 60 else repr(view)[:57] + "..."
            raise InvariantViolation(
                "views", f"build_c128a_topk_metadata returned {name} as a {type(view).__name__} "
                f"({shown}), not a tensor: each view is an int32 tensor over its buffer")
        if view.dtype != torch.int32:
            raise InvariantViolation(
                "views", f"build_c128a_topk_metadata returned {name} with dtype {view.dtype}, "
                "expected int32: each view is an int32 tensor over its buffer")
    return views
