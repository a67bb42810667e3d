"""The kernel-level function's call: its arguments and what it returns.

vLLM's ``build_c128a_topk_metadata(positions, compress_ratio,
num_decode_tokens, token_to_req_indices, block_table, block_size,
slot_mapping, global_decode_buffer, decode_lens_buffer, prefill_buffer,
max_compressed_tokens=8192)`` takes eleven arguments; :class:`BuildArgs`
is the one place their order is written. Every caller builds one and calls
``builder(*args)``; every builder of the project is written against
``BuildArgs`` and given vLLM's public signature by :func:`contract_builder`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, NamedTuple

import torch

from .sizes import DEFAULT_WIDTH

BUILD_FUNCTION = "build_c128a_topk_metadata"
"""The name of the kernel-level function every target provides."""


class BuildArgs(NamedTuple):
    """The arguments of ``build_c128a_topk_metadata``, in vLLM's order."""

    positions: torch.Tensor
    compress_ratio: int
    num_decode_tokens: int
    token_to_req_indices: torch.Tensor
    block_table: torch.Tensor
    block_size: int
    slot_mapping: torch.Tensor
    global_decode_buffer: torch.Tensor
    decode_lens_buffer: torch.Tensor
    prefill_buffer: torch.Tensor
    max_compressed_tokens: int = DEFAULT_WIDTH

    @property
    def width(self) -> int:
        """W, the active width."""
        return self.max_compressed_tokens

    @property
    def num_tokens(self) -> int:
        """T = len(positions)."""
        return self.positions.shape[0]


BUFFER_ARGUMENTS = ("global_decode_buffer", "decode_lens_buffer", "prefill_buffer")


class Views(NamedTuple):
    """What the function returns: views of the persistent buffers."""

    global_decode: torch.Tensor
    decode_lens: torch.Tensor
    prefill_local: torch.Tensor


def returned_views(args: BuildArgs, decode_width: int | None = None) -> Views:
    """The contract's views: ``global_decode_buffer[:D, :W]``,
    ``decode_lens_buffer[:D]``, ``prefill_buffer[:T - D, :W]``; row stride
    kept. ``decode_width`` (C for a target with full-width decode views)
    replaces W for the decode view."""
    d, w = args.num_decode_tokens, args.max_compressed_tokens
    return Views(
        args.global_decode_buffer[:d, : w if decode_width is None else decode_width],
        args.decode_lens_buffer[:d],
        args.prefill_buffer[: args.num_tokens - d, :w],
    )


BUILD_SIGNATURE = inspect.Signature(
    [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=BuildArgs._field_defaults.get(name, inspect.Parameter.empty),
        )
        for name in BuildArgs._fields
    ]
)


def contract_builder(
    implementation: Callable[[BuildArgs], Views], name: str = BUILD_FUNCTION
) -> Callable[..., Views]:
    """``implementation(args)`` behind vLLM's signature: positional or keyword
    arguments, ``max_compressed_tokens`` defaulting to 8192, bound into a
    :class:`BuildArgs` (a wrong count is a ``TypeError``, as for any function)."""

    @functools.wraps(implementation)
    def build_c128a_topk_metadata(*args, **kwargs) -> Views:
        return implementation(BuildArgs(*args, **kwargs))

    build_c128a_topk_metadata.__name__ = BUILD_FUNCTION
    build_c128a_topk_metadata.__qualname__ = name
    build_c128a_topk_metadata.__signature__ = BUILD_SIGNATURE
    return build_c128a_topk_metadata
