"""Builder faults that only inputs as an engine hands them show.

A builder tuned on a benchmark harness sees fresh, aligned input tensors it
may scribble on, slot ids equal to positions, unique pages, positions below
1M, capacities up to 8,192, buffers of one width and addresses that never
come back with another geometry. An engine hands it none of these for
sure (CONTRACT.md, "The whole input space"; :mod:`c128a.strategies.engine_inputs`
draws them). Each fault here is right on the harness's inputs and wrong on
the engine's; the first four write an input, which only
``inputs_unchanged`` (checked by every build) sees.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..contract import BuildArgs, Views, attended_lengths, returned_views
from ..contract import check_build_arguments as validated
from .builders import rows_of, write, write_and_return
from .consumer_faults import KeyedNamespace
from .registry import Mutant, builder_mutant, register

WRITES_AN_INPUT = "inputs written by the builder"
ENGINE_INPUTS = "inputs as an engine hands them"

# ---------------------------------------------------------------- builders that write an input


@builder_mutant(
    "turns positions into list lengths in place ((p + 1) // R, what it reads next) after "
    "computing its rows: right rows, but the positions other kernels of the step read "
    "after it hold lengths",
    WRITES_AN_INPUT,
    ("matches_oracle", "history_independent"),
)
def _build_writes_positions(args: BuildArgs) -> Views:
    validated(args)
    views = write_and_return(args, rows_of(args))
    args.positions.add_(1).floor_divide_(args.compress_ratio)
    return views


@builder_mutant(
    "normalises padding slots in place to the engine's -1 (any negative slot is padding, "
    "so it writes one kind): slot_mapping changes wherever a padding slot is below -1",
    WRITES_AN_INPUT,
    ("matches_oracle", "history_independent"),
)
def _build_writes_slot_mapping(args: BuildArgs) -> Views:
    validated(args)
    views = write_and_return(args, rows_of(args))
    args.slot_mapping.clamp_(min=-1)
    return views


@builder_mutant(
    "clamps the request indices in place to the block table's rows (a guard for its "
    "table reads): a prefill token's request index, past the decode rows, changes",
    WRITES_AN_INPUT,
    ("matches_oracle", "history_independent"),
)
def _build_writes_token_to_req_indices(args: BuildArgs) -> Views:
    validated(args)
    views = write_and_return(args, rows_of(args))
    args.token_to_req_indices.clamp_(max=max(args.block_table.shape[0] - 1, 0))
    return views


@builder_mutant(
    "clears in place the block-table columns past each decode row's last page (-1 where "
    "the table holds junk a build never reads): the table other kernels read changes",
    WRITES_AN_INPUT,
    ("matches_oracle", "history_independent"),
)
def _build_writes_block_table(args: BuildArgs) -> Views:
    validated(args)
    views = write_and_return(args, rows_of(args))
    d, table = args.num_decode_tokens, args.block_table
    if d and table.shape[1]:
        lengths = attended_lengths(args.positions[:d], args.compress_ratio,
                                   args.max_compressed_tokens)
        pages = (lengths + args.block_size - 1) // args.block_size
        rows = args.token_to_req_indices[:d].to(torch.int64)
        most = torch.zeros(table.shape[0], dtype=torch.int64, device=table.device)
        most.scatter_reduce_(0, rows, pages, "amax")
        columns = torch.arange(table.shape[1], device=table.device)
        table.masked_fill_(columns.unsqueeze(0) >= most.unsqueeze(1), -1)
    return views


# ---------------------------------------------------------------- where the inputs live


def _aligned_down(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` read from its address rounded down to 16 bytes, as a
    kernel told every input is 16-byte aligned (``tl.multiple_of``,
    vectorised loads) reads it."""
    short = tensor.data_ptr() % 16 // tensor.element_size()
    if not short:
        return tensor
    return tensor.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset() - short)


def _assumes_aligned(name: str, examples: int):
    def build(args: BuildArgs) -> Views:
        validated(args)
        early = _aligned_down(getattr(args, name))
        if name == "token_to_req_indices":
            # A kernel reading the row early takes what it finds as a table
            # row and reads wrong pages; the oracle's gather would instead
            # stop a CUDA process on an index out of range (a device-side
            # assert ends every later check of the process).
            early = early.clamp(0, max(args.block_table.shape[0] - 1, 0))
        write(args, *rows_of(args._replace(**{name: early})))
        return returned_views(args)

    build.__name__ = f"_build_assumes_aligned_{name}"
    return builder_mutant(
        f"reads {name} as if it started on a 16-byte boundary (its address rounded down, as "
        "vectorised loads hinted multiple_of(16) do): right for a tensor of its own or an "
        "aligned slice, a few elements early for a slice off a 16-byte boundary",
        ENGINE_INPUTS,
        ("matches_oracle",),
        # The ci profile's draws beside the covering array over every
        # pair (measured): an int32 input's unaligned slice is rarer early on.
        examples=examples,
    )(build)


for _name, _examples in (("positions", 25), ("token_to_req_indices", 150),
                         ("slot_mapping", 25), ("block_table", 25)):
    _assumes_aligned(_name, _examples)


# ---------------------------------------------------------------- the values an engine hands over


@builder_mutant(
    "keeps slot ids in int32 and takes an id the narrowing does not keep for a padding "
    "token (a round-trip guard beside its sign test): right for the -2^31 - 1 and -2^63 "
    "padding slots, wrong for a real slot id at or past 2^31 (its decode_lens 0)",
    ENGINE_INPUTS,
    ("matches_oracle",),
)
def _build_slot_ids_as_int32(args: BuildArgs) -> Views:
    validated(args)
    slots = args.slot_mapping
    kept = slots.to(torch.int32).to(torch.int64) == slots
    narrowed = torch.where(kept & (slots >= 0), slots, torch.full_like(slots, -1))
    return write_and_return(args, rows_of(args._replace(slot_mapping=narrowed)))


@builder_mutant(
    "writes each KV page's columns once a build, for the first decode request that reads "
    "it (a page-deduplicating writer, as a cache writer is): right for unique pages, "
    "stale columns in a later request's row where requests share pages (prefix caching, "
    "vLLM's null block 0)",
    ENGINE_INPUTS,
    ("matches_oracle",),
)
def _build_writes_each_page_once(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    d, table, block = args.num_decode_tokens, args.block_table, args.block_size
    if d and table.shape[1]:
        requests = args.token_to_req_indices[:d].to(torch.int64)
        columns = torch.arange(decode.shape[1], device=decode.device)
        page_columns = (columns // block).clamp(max=table.shape[1] - 1)
        pages = table.index_select(0, requests).gather(
            1, page_columns.expand(d, -1)).to(torch.int64)
        # The columns it writes slot ids into, for real tokens (a padding
        # token's row may hold junk columns' values, repeated in every row).
        active = (decode >= 0) & (args.slot_mapping[:d] >= 0).unsqueeze(1)
        # The first token (in order) reading each page, and so its request.
        read, readers = pages[active], requests.unsqueeze(1).expand_as(pages)[active]
        unique, which = torch.unique(read, return_inverse=True)
        order = torch.arange(read.numel(), device=read.device)
        first = torch.full((unique.numel(),), read.numel(), dtype=torch.int64,
                           device=read.device).scatter_reduce_(0, which, order, "amin")
        owned = torch.ones_like(active)
        owned[active] = readers[first][which] == readers
        kept = args.global_decode_buffer[:d, : decode.shape[1]]
        decode = torch.where(owned, decode, kept)
    return write_and_return(args, (decode, lens, prefill))


FIELD_BITS = 20


@builder_mutant(
    "keeps each request's first scheduled position in a 20-bit field of a packed "
    "(request, position) key and each token's position as that plus its offset in the "
    "request: right below position 2^20 (the engine's 1M context), wrong past it",
    ENGINE_INPUTS,
    ("matches_oracle",),
    examples=25,  # measured: the ci profile's draws beside the covering array over every pair
)
def _build_first_position_in_20_bits(args: BuildArgs) -> Views:
    validated(args)
    positions = args.positions
    if positions.numel():
        requests = args.token_to_req_indices[: positions.shape[0]].to(torch.int64)
        first = torch.full((int(requests.max()) + 1,), 1 << 62, dtype=torch.int64,
                           device=positions.device)
        first.scatter_reduce_(0, requests, positions, "amin")
        start = first[requests]
        positions = start % (1 << FIELD_BITS) + (positions - start)
    return write_and_return(args, rows_of(args, lengths=attended_lengths(
        positions, args.compress_ratio, args.max_compressed_tokens)))


ENGINE_COLUMNS = 8_192


@builder_mutant(
    "loops over columns up to vLLM's default max_compressed_tokens, 8,192 (the capacity at "
    "1M context, R = 128): columns past 8,192 of a wider build are never written",
    ENGINE_INPUTS,
    ("matches_oracle",),
    examples=100,  # a step past the caps is one small step in 32
)
def _build_columns_up_to_8192(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    write(args, decode[:, :ENGINE_COLUMNS], lens, prefill[:, :ENGINE_COLUMNS])
    return returned_views(args)


@builder_mutant(
    "refuses a prefill buffer narrower than the decode buffer (an assert of the layout of "
    "the engine it was written for, whose prefill buffer is the wider): the contract asks "
    "only 0 < W <= both widths",
    ENGINE_INPUTS,
    ("matches_oracle",),
)
def _build_prefill_buffer_at_least_as_wide(args: BuildArgs) -> Views:
    validated(args)
    if args.prefill_buffer.shape[1] < args.global_decode_buffer.shape[1]:
        raise ValueError(
            f"prefill_buffer has {args.prefill_buffer.shape[1]} columns, fewer than "
            f"global_decode_buffer's {args.global_decode_buffer.shape[1]}"
        )
    return write_and_return(args, rows_of(args))


# ---------------------------------------------------------------- addresses reused


_row_strides: dict[tuple[str, int], tuple[StorageWeakRef, int]] = {}


def _row_stride_at(buffer: torch.Tensor) -> int:
    """The row stride kept for ``buffer``'s address while its allocation
    lives (the first build's there), else its own, now kept."""
    key = (str(buffer.device), buffer.data_ptr())
    for stale in [k for k, (storage, _) in _row_strides.items() if storage.expired()]:
        del _row_strides[stale]
    kept = _row_strides.get(key)
    if kept is not None and kept[0].cdata == buffer.untyped_storage()._cdata:
        return kept[1]
    _row_strides[key] = (StorageWeakRef(buffer.untyped_storage()), buffer.stride(0))
    return buffer.stride(0)


@builder_mutant(
    "keeps each 2-D buffer's row stride per buffer address (a launch configuration cached by "
    "pointer while the allocation lives) and writes later builds at that address with it: a "
    "freed workspace handed to a step of another geometry gets rows at the old pitch",
    "history dependence",
    ("history_independent",),
    examples=50,  # measured: the ci profile's draws beside the covering array over every pair
)
def _build_row_stride_kept_per_address(args: BuildArgs) -> Views:
    validated(args)
    decode, lens, prefill = rows_of(args)
    for buffer, rows in ((args.global_decode_buffer, decode), (args.prefill_buffer, prefill)):
        stride = _row_stride_at(buffer)
        if rows.shape[0]:
            buffer.as_strided(tuple(rows.shape), (stride, 1)).copy_(rows)
    args.decode_lens_buffer[: lens.shape[0]] = lens
    return returned_views(args)


register(Mutant(
    "aligned_inputs_only_keys",
    "a builder launched through a keyed launcher (c128a.kernels.keyed) whose kernel keys on "
    "its input pointers' 16-byte alignment, while its warm-up compiles aligned inputs only: "
    "the first unaligned input slice compiles during inference",
    "recompilation mid-inference",
    ("compile_keys",),
    KeyedNamespace("aligned_inputs_only"),
))
