"""The reference oracle: the contract written as whole-tensor torch code.

Deliberately plain. Every other implementation is compared against this one
with ``torch.equal``. It writes exactly what the contract says the kernel
writes (rows < T, columns < W) and returns views of the persistent buffers.
"""

from __future__ import annotations

import types

import torch

from .call import BuildArgs, Views, contract_builder, returned_views
from .padding_rows import INERT, SLOTS, check_padding_rows
from .sizes import SENTINEL
from .validation import check_build_arguments


def attended_lengths(positions: torch.Tensor, compress_ratio: int, width: int) -> torch.Tensor:
    """n(t) = min(floor((p + 1) / R), W) for every token, as int64."""
    return torch.clamp((positions.to(torch.int64) + 1) // compress_ratio, max=width)


def write_metadata(args: BuildArgs, padding_rows: str = SLOTS) -> Views:
    """The oracle without its argument checks, for arguments already known to
    be inside the contract (the harness's expected values: checking them
    again costs a device synchronisation on every example). ``padding_rows``
    is the variant (:mod:`.padding_rows`): under ``inert`` a padding decode
    token's row is -1 in every column < W."""
    check_padding_rows(padding_rows, "the oracle")
    width = args.max_compressed_tokens
    num_tokens = args.num_tokens
    num_decode = args.num_decode_tokens
    device = args.positions.device

    lengths = attended_lengths(args.positions, args.compress_ratio, width)
    columns = torch.arange(width, device=device, dtype=torch.int64)
    active = columns.unsqueeze(0) < lengths.unsqueeze(1)

    if num_decode:
        padding = args.slot_mapping[:num_decode] < 0
        if padding_rows == INERT:
            # No active column: the row is all sentinel and reads no table entry.
            active[:num_decode] &= ~padding.unsqueeze(1)
        requests = args.token_to_req_indices[:num_decode].to(torch.int64)
        table = args.block_table
        table_width = table.shape[1]
        pages = torch.zeros(num_decode, width, device=device, dtype=torch.int64)
        if table_width:
            # Only the entries active columns read: columns past a row's need
            # hold junk a correct builder never reads (initcheck would see it).
            rows, active_columns = active[:num_decode].nonzero(as_tuple=True)
            pages[rows, active_columns] = table[
                requests[rows], active_columns // args.block_size
            ].to(torch.int64)
        slots = pages * args.block_size + columns % args.block_size
        # The sentinel as a Python scalar: a tensor would cost a host-to-device copy.
        args.global_decode_buffer[:num_decode, :width] = torch.where(
            active[:num_decode], slots, SENTINEL
        ).to(torch.int32)
        args.decode_lens_buffer[:num_decode] = torch.where(
            padding, torch.zeros_like(lengths[:num_decode]), lengths[:num_decode]
        ).to(torch.int32)

    if num_tokens > num_decode:
        args.prefill_buffer[: num_tokens - num_decode, :width] = torch.where(
            active[num_decode:], columns, SENTINEL
        ).to(torch.int32)

    return returned_views(args)


def _checked(args: BuildArgs) -> Views:
    check_build_arguments(args)
    return write_metadata(args)


def _checked_inert(args: BuildArgs) -> Views:
    check_build_arguments(args, INERT)
    return write_metadata(args, INERT)


build_c128a_topk_metadata = contract_builder(_checked)
"""The oracle as a target: vLLM's signature, every argument checked first."""

inert = types.SimpleNamespace(
    build_c128a_topk_metadata=contract_builder(_checked_inert, "inert"),
    padding_rows=INERT,
)
"""The oracle of the ``inert`` variant as a target (``reference-inert``)."""
