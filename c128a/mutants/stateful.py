"""Builder faults that remember earlier calls: what a build writes depends on
what the builder believes its buffers already hold.

Each is right as long as nothing but the builder itself writes its buffers
between two calls, so every property that builds into fresh buffers passes
it; only ``history_independent``, which builds into the same memory after
giving it other contents, can tell.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..contract import BuildArgs, Views, returned_views
from ..contract import check_build_arguments as validated
from .builders import rows_of
from .registry import builder_mutant


def _buffers(args: BuildArgs) -> tuple[torch.Tensor, ...]:
    return args.global_decode_buffer, args.decode_lens_buffer, args.prefill_buffer


def _memory_key(args: BuildArgs) -> tuple:
    """Where the call writes: each buffer's device, address, shape and strides."""
    return tuple(
        (str(buffer.device), buffer.data_ptr(), tuple(buffer.shape), buffer.stride())
        for buffer in _buffers(args)
    )


def _storages(args: BuildArgs) -> tuple[StorageWeakRef, ...]:
    """Weak references to the call's buffers' allocations: a memo is void once one is freed."""
    return tuple(StorageWeakRef(buffer.untyped_storage()) for buffer in _buffers(args))


def _forget_freed(memos: dict) -> None:
    """Drop the memos of allocations that were freed (their addresses may be reused)."""
    for stale in [key for key, memo in memos.items() if not memo.alive()]:
        del memos[stale]


def _versions(args: BuildArgs) -> tuple[int, ...]:
    return tuple(buffer._version for buffer in _buffers(args))


@dataclass
class _LastWrite:
    """What one call wrote into one set of buffers: its rows, at its width."""

    storages: tuple[StorageWeakRef, ...]
    versions: tuple[int, ...]
    width: int
    decode: torch.Tensor
    lens: torch.Tensor
    prefill: torch.Tensor

    def alive(self) -> bool:
        """The same allocation is still live (a freed buffer's address may be
        handed out again, holding something else: that memo is void)."""
        return not any(storage.expired() for storage in self.storages)

    def valid_for(self, args: BuildArgs) -> bool:
        """Live, at this width, and written by nothing torch has seen since
        (an in-place torch op on the buffers bumps their version counter)."""
        return (
            self.alive()
            and self.width == args.max_compressed_tokens
            and _versions(args) == self.versions
        )


_last_writes: dict[tuple, _LastWrite] = {}


def _changed(rows: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """Indices of the rows of ``rows`` that differ from ``last`` (rows past
    ``last``'s count were not written by the last call: changed too)."""
    common = min(rows.shape[0], last.shape[0])
    differs = torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device)
    if common:
        same = rows[:common] == last[:common]
        differs[:common] = ~(same.all(dim=1) if same.dim() == 2 else same)
    return torch.nonzero(differs).flatten()


@builder_mutant(
    "remembers, per buffer address (data_ptr, shape and strides, while that allocation "
    "lives and torch's version counter says no in-place op touched it), the rows and lens "
    "it wrote last, and re-writes only the rows whose values changed since: right while "
    "nothing else writes its buffers, stale once another writer (a CUDA graph, another "
    "kernel) re-poisons or overwrites them between two builds",
    "history dependence",
    ("history_independent",),
)
def _build_remembers_last_write(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    width = args.max_compressed_tokens
    key = _memory_key(args)
    last = _last_writes.get(key)
    if last is not None and last.valid_for(args):
        d_rows, p_rows = _changed(decode, last.decode), _changed(prefill, last.prefill)
        l_rows = _changed(lens, last.lens)
    else:  # memory it has not written (or not at this width, or seen written): everything
        d_rows = torch.arange(decode.shape[0], device=decode.device)
        p_rows = torch.arange(prefill.shape[0], device=prefill.device)
        l_rows = torch.arange(lens.shape[0], device=lens.device)
    args.global_decode_buffer[d_rows, :width] = decode[d_rows]
    args.decode_lens_buffer[l_rows] = lens[l_rows]
    args.prefill_buffer[p_rows, :width] = prefill[p_rows]
    _forget_freed(_last_writes)
    _last_writes[key] = _LastWrite(
        storages=_storages(args),
        versions=_versions(args),  # after its own writes
        width=width,
        decode=decode.clone(),
        lens=lens.clone(),
        prefill=prefill.clone(),
    )
    return returned_views(args)


@dataclass
class _LastWidth:
    storages: tuple[StorageWeakRef, ...]
    width: int

    def alive(self) -> bool:
        return not any(storage.expired() for storage in self.storages)


_last_widths: dict[tuple, _LastWidth] = {}


@builder_mutant(
    "remembers, per buffer address, the width of its last build there, and writes the -1 "
    "sentinel only in columns below it, counting on the buffers' first fill for the "
    "columns past it: a build wider than the last one leaves whatever an earlier, "
    "narrower step's memory held in [W_last, W)",
    "history dependence",
    ("history_independent",),
)
def _build_sentinels_only_up_to_last_width(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    width = args.max_compressed_tokens
    key = _memory_key(args)
    last = _last_widths.get(key)
    known = last.width if last is not None and last.alive() else width
    d, p = decode.shape[0], prefill.shape[0]
    args.global_decode_buffer[:d, :min(width, known)] = decode[:, :known]
    args.prefill_buffer[:p, :min(width, known)] = prefill[:, :known]
    if width > known:
        # Past the last width only the active entries: their -1s are "already there".
        for buffer, rows in ((args.global_decode_buffer, decode), (args.prefill_buffer, prefill)):
            region = buffer[: rows.shape[0], known:width]
            tail = rows[:, known:]
            region.copy_(torch.where(tail >= 0, tail, region))
    args.decode_lens_buffer[:d] = lens
    _forget_freed(_last_widths)
    _last_widths[key] = _LastWidth(_storages(args), width)
    return returned_views(args)
