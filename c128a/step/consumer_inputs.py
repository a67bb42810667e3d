"""Consumers of a build's views, and what an engine hands them.

A :class:`Consumer` is one kernel (or the oracle's statement of it) that
reads the views a build returned; :class:`ConsumerInputs` is everything an
engine passes it beside the views, derived from the step (:meth:`from_build`)
so that a saved :class:`~c128a.step.Batch` replays it. :data:`ORACLE_CONSUMERS`
are the plain-torch consumers of :mod:`c128a.contract.oracle_consumers`, the
consumers of every target that names none of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..contract import oracle_consumers as oracle
from .buffers import BuildResult

WINDOW_SIZE = 128
"""DeepSeek-V4's sliding window."""
SWA_BLOCK_SIZE = 256
"""The sliding-window cache's page, in tokens (the engine's KV page)."""
GATHER_STRIDE = 1 << 12
"""``M`` of ``combine_topk_swa_indices``: the gathered buffer's per-request stride."""
GATHER_OFFSET = 1 << 11
"""``N`` of ``combine_topk_swa_indices``: where the gathered window starts."""
ALL_TOKENS = "all tokens"
PREFILL_TOKENS = "prefill tokens"


def _table(rows: int, columns: int, salt: int, block_size: int) -> torch.Tensor:
    """A block table whose entries differ from row to row and column to
    column: page numbers below 2**19, and below 2**31 / B, so that every
    slot id (page x B + offset) fits 32 bits at any B up to C."""
    r = torch.arange(rows, dtype=torch.int64)[:, None]
    c = torch.arange(max(columns, 1), dtype=torch.int64)[None, :]
    pages = min(524_287, (2**31 - 1) // block_size - 1)
    return ((r * 7919 + c * 104729 + salt) % pages + 1).to(torch.int32)


@dataclass(frozen=True)
class ConsumerInputs:
    """One build's views and what the engine hands their consumers, on the
    build's device. Each token is its own consumer request (its block-table
    row, its ``query_start_loc`` entry, ``seq_len = position + 1``), so a
    consumer's idea of a token's position is the builder's."""

    global_decode: torch.Tensor
    decode_lens: torch.Tensor
    prefill_local: torch.Tensor
    positions: torch.Tensor  # int64 [T]
    is_valid_token: torch.Tensor  # bool [T]: slot_mapping >= 0
    token_requests: torch.Tensor  # int32 [T]: token t is request t
    query_start_loc: torch.Tensor  # int32 [T + 1]
    seq_lens: torch.Tensor  # int32 [T]
    compressed_block_table: torch.Tensor  # int32 [T, pages]
    swa_block_table: torch.Tensor  # int32 [T, pages]
    decode_swa_indices: torch.Tensor  # int32 [D, WINDOW_SIZE]
    block_size: int
    compress_ratio: int
    width: int

    @property
    def num_decode_tokens(self) -> int:
        return int(self.global_decode.shape[0])

    @classmethod
    def from_build(cls, result: BuildResult) -> "ConsumerInputs":
        batch = result.batch
        global_decode, decode_lens, prefill_local = result.views
        device = global_decode.device
        t, d = batch.num_tokens, batch.num_decode_tokens
        positions = torch.tensor(batch.positions, dtype=torch.int64)
        r, b = batch.compress_ratio, batch.block_size
        longest = int(positions.max()) + 1 if t else 1
        lists = min(longest // r, batch.capacity)  # the same at every W
        # As wide as an engine's block table (a page per 256 tokens of
        # max_model_len): its row stride is part of a consumer's compile key.
        engine_pages = -(-batch.max_model_len // (r * b))
        compressed = _table(t, max(-(-lists // b), engine_pages), salt=11, block_size=b)
        swa = _table(t, max(-(-longest // SWA_BLOCK_SIZE), engine_pages), salt=29,
                     block_size=SWA_BLOCK_SIZE)
        columns = torch.arange(WINDOW_SIZE)
        decode_positions = positions[:d, None]
        decode_swa = torch.where(
            columns[None, :] < torch.clamp(decode_positions + 1, max=WINDOW_SIZE),
            (1 << 24) + decode_positions - columns[None, :], -1,
        ).to(torch.int32)
        slots = torch.tensor(batch.slot_mapping[:t], dtype=torch.int64)
        on = lambda tensor: tensor.to(device)  # noqa: E731
        return cls(
            global_decode=global_decode,
            decode_lens=decode_lens,
            prefill_local=prefill_local,
            positions=on(positions),
            is_valid_token=on(slots >= 0),
            token_requests=on(torch.arange(t, dtype=torch.int32)),
            query_start_loc=on(torch.arange(t + 1, dtype=torch.int32)),
            seq_lens=on((positions + 1).to(torch.int32)),
            compressed_block_table=on(compressed),
            swa_block_table=on(swa),
            decode_swa_indices=on(decode_swa),
            block_size=b,
            compress_ratio=r,
            width=result.width,
        )


Published = tuple  # (indices [rows, columns], lens [rows] or None: whole rows)


@dataclass(frozen=True)
class Consumer:
    """One consumer: ``run(inputs)`` returns what it publishes, ``(indices,
    lens)``; its rows are the step's tokens (``rows`` :data:`ALL_TOKENS`)
    or its prefill tokens (:data:`PREFILL_TOKENS`). ``launchers`` are its
    keyed launch objects (compile keys, :mod:`c128a.kernels.launch_keys`),
    where it exposes them."""

    name: str
    run: Callable[[ConsumerInputs], Published]
    rows: str
    doc: str = ""
    launchers: tuple = ()

    def __call__(self, inputs: ConsumerInputs) -> Published:
        return self.run(inputs)


def _host(inputs: ConsumerInputs, name: str) -> torch.Tensor:
    return getattr(inputs, name).cpu()


def oracle_global_topk(i: ConsumerInputs) -> Published:
    d = i.num_decode_tokens
    return oracle.global_topk(
        _host(i, "prefill_local"), _host(i, "token_requests")[d:],
        _host(i, "compressed_block_table"), i.block_size, _host(i, "is_valid_token")[d:],
    )


def mixed_topk(i: ConsumerInputs) -> int:
    """The ``topk`` the FlashInfer backend passes: the prefill view's width,
    0 in a step without prefill tokens."""
    return int(i.prefill_local.shape[1]) if i.prefill_local.shape[0] else 0


def oracle_mixed_sparse(i: ConsumerInputs) -> Published:
    return oracle.mixed_sparse(
        _host(i, "decode_swa_indices"), _host(i, "global_decode"), _host(i, "decode_lens"),
        _host(i, "prefill_local"), _host(i, "positions"), _host(i, "swa_block_table"),
        SWA_BLOCK_SIZE, _host(i, "compressed_block_table"), i.block_size, WINDOW_SIZE,
        i.compress_ratio, mixed_topk(i),
    )


def oracle_combine_swa(i: ConsumerInputs) -> Published:
    d = i.num_decode_tokens
    return oracle.combine_swa(
        _host(i, "prefill_local"), _host(i, "positions")[d:], WINDOW_SIZE, i.compress_ratio,
        int(i.prefill_local.shape[1]), GATHER_STRIDE, GATHER_OFFSET,
    )


def oracle_short_context_fill(i: ConsumerInputs) -> Published:
    return oracle.short_context_fill(_host(i, "positions"), i.width, i.compress_ratio)


CONSUMER_NAMES = ("global_topk", "mixed_sparse", "combine_swa", "short_context_fill")
"""The consumers a target may name, in order."""

ORACLE_CONSUMERS: tuple[Consumer, ...] = (
    Consumer("global_topk", oracle_global_topk, PREFILL_TOKENS,
             "compute_global_topk_indices_and_lens on the prefill view"),
    Consumer("mixed_sparse", oracle_mixed_sparse, ALL_TOKENS,
             "build_flashinfer_mixed_sparse_indices on the decode view, its lengths and the "
             "prefill view"),
    Consumer("combine_swa", oracle_combine_swa, PREFILL_TOKENS,
             "combine_topk_swa_indices on the prefill view"),
    Consumer("short_context_fill", oracle_short_context_fill, ALL_TOKENS,
             "fill_short_context_topk_indices at TOP_K = W (every token's list, as the "
             "prefill view holds it)"),
)
"""The oracle's consumers: a target that names none is checked with these."""
