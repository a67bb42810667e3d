"""The captured consumer: what a decode attention kernel inside a FULL CUDA
graph reads of the metadata, and an emulation of it for the CPU.

For each row t and column j < lens[t] (clamped to the captured width), the
consumer reads the index at column j of row t and gathers the value at that
index from a KV-like table (:func:`kv_table`); it outputs 0 past lens and
:data:`OUT_OF_TABLE` for an index outside the table (-1 sentinels, -99 poison).
On CUDA it is a Triton kernel captured in a real ``torch.cuda.CUDAGraph``
(:mod:`c128a.kernels.consumer_kernel`, imported only then); on the CPU it is
emulated: ``torch.as_strided`` on the buffer's storage with the geometry
frozen at capture, which reads exactly the bytes the graph would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..failures import InvariantViolation

OUT_OF_TABLE = -1
"""Consumer output for an index outside the KV table (a sentinel or poison read)."""

KV_VALUE_BASE = 1_000_000
"""The KV table holds KV_VALUE_BASE + slot, so a value names the slot it came from."""


def kv_table(num_slots: int, device: torch.device | str) -> torch.Tensor:
    """The KV-like table the consumer gathers from: slot i holds KV_VALUE_BASE + i."""
    return KV_VALUE_BASE + torch.arange(num_slots, dtype=torch.int64, device=device)


def consume(indices: torch.Tensor, lens: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """What the consumer computes from an index window [S, Wc] and lens [S].

    Row t, column j < min(lens[t], Wc): kv[indices[t, j]], or OUT_OF_TABLE when
    the index is outside the table; 0 past lens.
    """
    out = torch.zeros(indices.shape, dtype=torch.int64, device=indices.device)
    if indices.numel() == 0:
        return out
    # Columns at or past the longest list are 0: skip them (most lists are short).
    read = max(0, min(int(lens.max()), indices.shape[1]))
    index = indices[:, :read].to(torch.int64)
    columns = torch.arange(read, device=indices.device)
    active = columns.unsqueeze(0) < lens.to(torch.int64).unsqueeze(1)
    in_table = (index >= 0) & (index < kv.numel())
    values = kv[index.clamp(0, kv.numel() - 1)]
    out[:, :read] = torch.where(active & in_table, values, torch.where(active, OUT_OF_TABLE, 0))
    return out


def sentinel_lengths(indices: torch.Tensor) -> torch.Tensor:
    """Per row, the column of the first -1 (the row's width when there is none):
    how far a consumer that trusts the sentinel instead of lens reads."""
    width = indices.shape[1]
    columns = torch.arange(width, device=indices.device).expand_as(indices)
    return torch.where(indices == -1, columns, width).amin(dim=1)


@dataclass
class ConsumerOutput:
    """One replay: the index window and lens the consumer saw, and its output."""

    indices_seen: torch.Tensor  # int32 [S, Wc]
    lens_seen: torch.Tensor  # int32 [S]
    gathered: torch.Tensor  # int64 [S, Wc]


@dataclass(frozen=True)
class Geometry:
    """Where a consumer reads, as frozen at capture."""

    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @classmethod
    def of(cls, view: torch.Tensor) -> "Geometry":
        return cls(view.storage_offset(), tuple(view.shape), tuple(view.stride()))

    def __str__(self) -> str:
        return f"storage offset {self.storage_offset}, shape {self.shape}, strides {self.stride}"


def freeze(view: torch.Tensor, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """A tensor reading ``shape`` elements through ``view``'s pointer and strides.

    This is what a graph captured on ``view`` reads at every replay, whatever
    the later steps return: same storage, same offset, same strides.
    """
    strides = view.stride()
    offset = view.storage_offset()
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)
    elements = view.untyped_storage().nbytes() // view.element_size()
    if last >= elements or min(strides, default=0) < 0:
        raise InvariantViolation(
            "replay",
            f"{what}: a consumer captured on this view (storage offset {offset}, strides "
            f"{tuple(strides)}) reads {shape} elements, up to element {last}, but the view's "
            f"storage holds {elements}; the capture-time view does not cover the captured rows"
        )
    return torch.as_strided(view, shape, strides, offset)


class EmulatedConsumer:
    """The consumer on the CPU (or on CUDA without a graph): it reads through
    tensors frozen at capture, so a replay sees the buffers' current bytes."""

    def __init__(self, indices: torch.Tensor, lens: torch.Tensor, kv: torch.Tensor):
        self.indices, self.lens, self.kv = indices, lens, kv

    def replay(self) -> ConsumerOutput:
        indices_seen = self.indices.clone()
        lens_seen = self.lens.clone()
        return ConsumerOutput(indices_seen, lens_seen, consume(indices_seen, lens_seen, self.kv))


class GraphedConsumer:
    """The consumer as a Triton kernel captured in a real CUDA graph."""

    def __init__(self, indices: torch.Tensor, lens: torch.Tensor, kv: torch.Tensor):
        # A kernel module, imported only once CUDA was chosen (a real graph needs it).
        from ..kernels.consumer_kernel import GraphConsumer

        self.graph = GraphConsumer(indices, lens, kv, OUT_OF_TABLE)

    def replay(self) -> ConsumerOutput:
        return ConsumerOutput(*self.graph.replay())


def make_consumer(indices: torch.Tensor, lens: torch.Tensor, kv: torch.Tensor, mode: str):
    """A captured consumer: a real CUDA graph (``mode='cuda'``) or the emulation."""
    if mode == "cuda":
        return GraphedConsumer(indices, lens, kv)
    return EmulatedConsumer(indices, lens, kv)
