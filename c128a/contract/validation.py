"""Checks at the public boundary.

Public entry points call these before touching any buffer, so a rejected call
leaves every buffer as it was. Messages name the argument, its value, the rule
and, where there is one, the fix; they raise
:class:`~c128a.failures.BadArgument`. Internal code trusts its inputs.
"""

from __future__ import annotations

import torch

from .. import phases
from ..failures import BadArgument, HarnessError
from .call import BuildArgs
from .padding_rows import INERT, SLOTS
from .sizes import WIDTH_ALIGNMENT


def check(condition: bool, message: str) -> None:
    if not condition:
        raise BadArgument(message)


def check_positive_int(name: str, value: object) -> int:
    check(
        isinstance(value, int) and not isinstance(value, bool),
        f"{name}={value!r} must be an int",
    )
    check(value > 0, f"{name}={value} must be > 0")
    return value


def check_tensor(
    name: str,
    tensor: object,
    *,
    dtype: torch.dtype,
    ndim: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    check(
        isinstance(tensor, torch.Tensor),
        f"{name} must be a torch.Tensor, got {type(tensor).__name__}",
    )
    check(
        tensor.dtype == dtype,
        f"{name}.dtype={tensor.dtype} must be {dtype}",
    )
    check(
        tensor.dim() == ndim,
        f"{name} must have {ndim} dimension(s), got shape {tuple(tensor.shape)}",
    )
    if device is not None:
        check(
            tensor.device == device,
            f"{name} is on {tensor.device} but positions is on {device}; "
            "every tensor must be on one device",
        )
    return tensor


def check_unit_last_stride(name: str, tensor: torch.Tensor) -> None:
    if tensor.numel() == 0 or tensor.shape[-1] <= 1:
        return
    check(
        tensor.stride(-1) == 1,
        f"{name}.stride(-1)={tensor.stride(-1)} must be 1: the kernels index its last "
        f"dimension densely (pass a slice of a contiguous tensor, or {name}.contiguous())",
    )


@phases.measured("validation")
def check_build_arguments(args: BuildArgs, padding_rows: str = SLOTS) -> None:
    """Reject any call of ``build_c128a_topk_metadata`` outside the contract.

    Runs before any write. The value checks (positions, request indices, table
    width) read device tensors, so they synchronise: the price of a test
    subject that refuses instead of reading out of bounds. Under the
    ``inert`` padding-row variant a padding token's row reads no table
    entry, so its (stale) position need not fit the table.
    """
    positions = check_tensor("positions", args.positions, dtype=torch.int64, ndim=1)
    device = positions.device
    num_tokens = positions.shape[0]
    ratio = check_positive_int("compress_ratio", args.compress_ratio)
    block = check_positive_int("block_size", args.block_size)
    width = args.max_compressed_tokens
    check(
        isinstance(width, int) and not isinstance(width, bool),
        f"max_compressed_tokens={width!r} must be an int",
    )
    check(width > 0, f"max_compressed_tokens={width} must be > 0")
    check(
        width % WIDTH_ALIGNMENT == 0,
        f"max_compressed_tokens={width} must be a multiple of {WIDTH_ALIGNMENT} (FlashMLA's "
        f"decode tile); the next valid width is {-(-width // WIDTH_ALIGNMENT) * WIDTH_ALIGNMENT}",
    )
    num_decode = args.num_decode_tokens
    check(
        isinstance(num_decode, int) and not isinstance(num_decode, bool),
        f"num_decode_tokens={num_decode!r} must be an int",
    )
    check(
        0 <= num_decode <= num_tokens,
        f"num_decode_tokens={num_decode} must be in [0, T={num_tokens}] (T = len(positions))",
    )
    num_prefill = num_tokens - num_decode

    req = check_tensor(
        "token_to_req_indices", args.token_to_req_indices, dtype=torch.int32, ndim=1, device=device
    )
    check(
        req.shape[0] >= num_tokens,
        f"token_to_req_indices has {req.shape[0]} entries but T={num_tokens} tokens need one each",
    )
    table = check_tensor("block_table", args.block_table, dtype=torch.int32, ndim=2, device=device)
    check_unit_last_stride("block_table", table)
    slots = check_tensor("slot_mapping", args.slot_mapping, dtype=torch.int64, ndim=1, device=device)
    check(
        slots.shape[0] >= num_tokens,
        f"slot_mapping has {slots.shape[0]} entries, shorter than T={num_tokens}",
    )

    decode_buf = check_tensor(
        "global_decode_buffer", args.global_decode_buffer, dtype=torch.int32, ndim=2, device=device
    )
    lens_buf = check_tensor(
        "decode_lens_buffer", args.decode_lens_buffer, dtype=torch.int32, ndim=1, device=device
    )
    prefill_buf = check_tensor(
        "prefill_buffer", args.prefill_buffer, dtype=torch.int32, ndim=2, device=device
    )
    for name, vector in (
        ("positions", positions),
        ("token_to_req_indices", req),
        ("slot_mapping", slots),
        ("decode_lens_buffer", lens_buf),
    ):
        check_unit_last_stride(name, vector)
    for name, buf in (("global_decode_buffer", decode_buf), ("prefill_buffer", prefill_buf)):
        check(
            buf.stride(-1) == 1,
            f"{name}.stride(-1)={buf.stride(-1)} must be 1 (the consumers read dense rows)",
        )
        check(
            width <= buf.shape[1],
            f"max_compressed_tokens={width} is wider than {name} "
            f"({buf.shape[1]} columns); the width must be <= the buffer's capacity",
        )
    check(
        decode_buf.shape[0] >= num_decode,
        f"global_decode_buffer has {decode_buf.shape[0]} rows, fewer than "
        f"num_decode_tokens={num_decode}",
    )
    check(
        lens_buf.shape[0] >= num_decode,
        f"decode_lens_buffer has {lens_buf.shape[0]} entries, fewer than "
        f"num_decode_tokens={num_decode}",
    )
    check(
        prefill_buf.shape[0] >= num_prefill,
        f"prefill_buffer has {prefill_buf.shape[0]} rows, fewer than the "
        f"{num_prefill} prefill tokens (T - num_decode_tokens)",
    )

    if num_tokens == 0:
        return
    # The value checks read the device once: a few reductions copied
    # together (one synchronisation, a handful of launches), then compared on
    # the host. Only a failing check reads further, to name the first offender.
    reductions = [positions.min()]
    if num_decode:
        decode_req = req[:num_decode]
        req_low, req_high = torch.aminmax(decode_req)
        # n(t), and so the pages a decode token needs, grows with its position.
        table_positions = positions[:num_decode]
        if padding_rows == INERT:
            table_positions = torch.where(slots[:num_decode] < 0, 0, table_positions)
        reductions += [table_positions.max(), req_low.long(), req_high.long()]
    values = torch.stack(reductions).tolist()
    failed = values[0] < 0
    if num_decode:
        last_position, low_request, high_request = values[1:]
        most_pages = -(-min((last_position + 1) // ratio, width) // block)
        failed = failed or low_request < 0 or high_request >= table.shape[0]
        failed = failed or most_pages > table.shape[1]
    if not failed:
        return
    first_negative = _first_index(positions < 0)
    check(
        first_negative is None,
        f"positions[{first_negative}] is negative; positions must be >= 0",
    )
    bad_req = _first_index((decode_req < 0) | (decode_req >= table.shape[0]))
    if bad_req is not None:
        raise BadArgument(
            f"token_to_req_indices[{bad_req}]={int(decode_req[bad_req])} but block_table has "
            f"{table.shape[0]} rows; every decode token's request needs a block-table row"
        )
    lengths = torch.clamp((table_positions + 1) // ratio, max=width)
    pages_needed = (lengths + block - 1) // block
    bad_row = _first_index(pages_needed > table.shape[1])
    if bad_row is not None:
        raise BadArgument(
            f"decode token {bad_row} (position {int(positions[bad_row])}) attends to "
            f"{int(lengths[bad_row])} compressed entries, which needs "
            f"{int(pages_needed[bad_row])} block-table columns; block_table has {table.shape[1]}"
        )
    raise HarnessError(f"a value check failed but no offender was found: {values}")


def _first_index(mask: torch.Tensor) -> int | None:
    hits = torch.nonzero(mask)
    return int(hits[0, 0]) if hits.numel() else None
