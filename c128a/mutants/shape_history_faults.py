"""Builder faults that keep state between steps keyed on the last shape.

Each keeps something per workspace (the allocations its three buffers live
in, whichever way round and from whichever row): a launch grid, a staging
scratch, the decode/prefill split, the buffer views, the geometry. Each is
right while every step into that workspace has the shape of the first one
(or the last one), so a property that builds into fresh buffers passes it,
and so does ``history_independent`` while the earlier step it builds has the
step's own shape; only an earlier step of another shape
(:class:`~c128a.step.PriorStep`) shows the fault. The contract: a build's
written region depends on its arguments alone, whatever steps ran before it
(CONTRACT.md, "The whole input space").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..contract import BuildArgs, Views, returned_views
from ..contract import check_build_arguments as validated
from .builders import rows_of, write_and_return
from .registry import builder_mutant

ROW_BLOCK = 64
"""Rows one program of the faulty launches below handles."""


def _buffers(args: BuildArgs) -> tuple[torch.Tensor, ...]:
    return args.global_decode_buffer, args.decode_lens_buffer, args.prefill_buffer


def _workspace(args: BuildArgs) -> tuple:
    """The allocations the call's buffers live in, in no order: the same
    workspace whichever buffer sits where in it."""
    return tuple(sorted({
        (str(buffer.device), buffer.untyped_storage().data_ptr()) for buffer in _buffers(args)
    }))


@dataclass
class _Kept:
    """Something kept for one workspace while its allocations live (a freed
    allocation's address may be handed out again, holding something else)."""

    storages: tuple[StorageWeakRef, ...]
    value: Any

    def alive(self) -> bool:
        return not any(storage.expired() for storage in self.storages)


class _PerWorkspace:
    """A value per workspace, forgotten when one of its allocations is freed."""

    def __init__(self):
        self._kept: dict[tuple, _Kept] = {}

    def get(self, args: BuildArgs, key: tuple = ()):
        for stale in [k for k, kept in self._kept.items() if not kept.alive()]:
            del self._kept[stale]
        kept = self._kept.get((_workspace(args), *key))
        return None if kept is None else kept.value

    def put(self, args: BuildArgs, value, key: tuple = ()) -> None:
        storages = tuple(StorageWeakRef(b.untyped_storage()) for b in _buffers(args))
        self._kept[(_workspace(args), *key)] = _Kept(storages, value)


def _blocks(rows: int) -> int:
    return -(-rows // ROW_BLOCK)


_grids = _PerWorkspace()


@builder_mutant(
    "launches its decode rows in 64-row programs, the grid kept per workspace from the "
    "previous build into it (a launch configuration cached with the buffers, refreshed "
    "after each launch): a step with more 64-row blocks of decode rows than the step before "
    "it leaves its rows past that step's blocks, and their decode_lens, as the memory held them",
    "history dependence",
    ("history_independent",),
)
def _build_decode_grid_from_last_build(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    blocks = _grids.get(args)
    rows = decode.shape[0] if blocks is None else min(decode.shape[0], blocks * ROW_BLOCK)
    _grids.put(args, _blocks(decode.shape[0]))
    return write_and_return(args, (decode[:rows], lens[:rows], prefill))


_scratches = _PerWorkspace()


@builder_mutant(
    "stages prefill rows through a scratch it allocates on its first build into a workspace, "
    "sized by that build's prefill rows and never grown: a later step with more prefill rows "
    "than the workspace's first step writes only as many, the rest kept as the memory held them",
    "history dependence",
    ("history_independent",),
)
def _build_prefill_scratch_from_first_build(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    scratch = _scratches.get(args)
    if scratch is None:
        scratch = torch.empty(prefill.shape, dtype=torch.int32, device=prefill.device)
        _scratches.put(args, scratch)
    staged = min(prefill.shape[0], scratch.shape[0])
    columns = min(prefill.shape[1], scratch.shape[1])
    scratch[:staged, :columns] = prefill[:staged, :columns]
    args.prefill_buffer[:staged, :columns] = scratch[:staged, :columns]
    args.prefill_buffer[:staged, columns : prefill.shape[1]] = prefill[:staged, columns:]
    return write_and_return(args, (decode, lens, prefill[:0]))


_splits = _PerWorkspace()


@builder_mutant(
    "keeps, per workspace and token count T, the decode/prefill split of the first step of "
    "T tokens (taking the split for a function of T, as it is for a captured decode-only "
    "size) and places prefill rows by it: a later step of the same T with another split "
    "writes its prefill rows that many rows off",
    "history dependence",
    ("history_independent",),
)
def _build_split_kept_per_token_count(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    num_tokens, num_decode = args.positions.shape[0], args.num_decode_tokens
    kept = _splits.get(args, (num_tokens,))
    if kept is None:
        kept = num_decode
        _splits.put(args, kept, (num_tokens,))
    write_and_return(args, (decode, lens, prefill[:0]))
    shift = num_decode - kept  # where it believes prefill row 0 goes, less where it does
    rows, width = prefill.shape
    start = max(shift, 0)
    stop = min(shift + rows, args.prefill_buffer.shape[0])
    if stop > start:
        args.prefill_buffer[start:stop, :width] = prefill[start - shift : stop - shift]
    return returned_views(args)


_views = _PerWorkspace()


@builder_mutant(
    "keeps, per workspace, the three buffer views of its first build into it and writes "
    "every later build through them (views cached with the allocation, as a graph-friendly "
    "builder might): right while every step places its buffers the same way, wrong rows or "
    "buffers once a step before placed them otherwise (swapped, from a row offset)",
    "history dependence",
    ("history_independent",),
)
def _build_views_kept_per_workspace(args: BuildArgs) -> Views:
    validated(args)
    places = _views.get(args)
    if places is None:
        places = tuple(
            (buffer.untyped_storage().data_ptr(), buffer.storage_offset(), tuple(buffer.shape),
             buffer.stride())
            for buffer in _buffers(args)
        )
        _views.put(args, places)
    storages = {b.untyped_storage().data_ptr(): b.untyped_storage() for b in _buffers(args)}
    kept = [
        torch.empty(0, dtype=torch.int32, device=args.positions.device).set_(
            storages[pointer], offset, shape, stride)
        for pointer, offset, shape, stride in places
    ]
    decode, lens, prefill = rows_of(args)
    d, p, width = decode.shape[0], prefill.shape[0], args.max_compressed_tokens
    kept[0][:d, :width] = decode
    kept[1][:d] = lens
    kept[2][:p, :width] = prefill
    return returned_views(args)


_geometries = _PerWorkspace()


@builder_mutant(
    "keeps, per workspace, the compress ratio and block size of its first build into it "
    "(constants baked in when the buffers were first used) and builds every later step with "
    "them: a layer of another geometry that used the same buffers first leaves its R and B "
    "in every later list",
    "history dependence",
    ("history_independent",),
)
def _build_geometry_of_first_build(args: BuildArgs) -> Views:
    validated(args)
    kept = _geometries.get(args)
    if kept is None:
        kept = (args.compress_ratio, args.block_size)
        _geometries.put(args, kept)
    ratio, block = kept
    return write_and_return(args, rows_of(args._replace(compress_ratio=ratio, block_size=block)))
