"""What each consumer of the builder's views computes, in plain torch.

A *consumer* is a kernel an engine launches on the views a build returns
(CONTRACT.md, "Consumers"). These are the suite's statements of four that
vLLM's DeepSeek-V4 backends launch, written from their documented
behaviour; the checks compare a target's consumers with them
(:mod:`c128a.checks.consumers`). Each returns ``(indices, lens)``: the rows
a downstream attention kernel reads, and per row how many leading columns
it reads (``lens`` None: the whole row). Nothing past ``lens[r]`` in row
``r`` is published.

Names follow the engine's: ``D`` decode tokens first, then ``P`` prefill
tokens; ``R`` the compress ratio, ``B`` the compressed block size. Every
consumer request here has one query token (the tests hand each token its
own request), so a token's position is its request's ``seq_len - 1``.
"""

from __future__ import annotations

import torch

SENTINEL = -1


def _slots(local: torch.Tensor, table_rows: torch.Tensor, block_size: int) -> torch.Tensor:
    """Local compressed indices through block-table rows (one row per index
    row) to global slot ids; -1 where ``local`` is negative. Reads the
    table only where an index is valid."""
    valid = local >= 0
    safe = torch.where(valid, local, torch.zeros_like(local)).long()
    pages = torch.gather(table_rows.long(), 1, torch.div(safe, block_size, rounding_mode="floor"))
    slots = pages * block_size + safe % block_size
    return torch.where(valid, slots, torch.full_like(slots, SENTINEL)).to(torch.int32)


def global_topk(topk_indices, token_to_req_indices, block_table, block_size, is_valid_token):
    """``compute_global_topk_indices_and_lens``: each row's local indices to
    global slot ids through its request's block-table row (-1 stays -1);
    its length is the count of valid (>= 0) entries in the row, 0 for a
    padding token. The row is read in full: this consumer relies on the
    -1 past a token's list."""
    rows = block_table[token_to_req_indices.long()]
    local = topk_indices.long()
    if local.numel() == 0:
        indices = torch.empty_like(topk_indices, dtype=torch.int32)
    else:
        needed = torch.div(local.clamp(min=0), block_size, rounding_mode="floor").max() + 1
        if rows.shape[1] < int(needed):
            rows = torch.nn.functional.pad(rows, (0, int(needed) - rows.shape[1]))
        indices = _slots(local, rows, block_size)
    count = (local >= 0).sum(dim=1).to(torch.int32)
    lens = torch.where(is_valid_token.bool(), count, torch.zeros_like(count))
    return indices, lens


def _window(positions, window_size: int):
    start = (positions - (window_size - 1)).clamp(min=0)
    return start, positions - start + 1


def mixed_sparse(decode_swa_indices, decode_compressed, decode_lens, prefill_local, positions,
                 swa_block_table, swa_block_size, compressed_block_table, block_size,
                 window_size, compress_ratio, topk):
    """``build_flashinfer_mixed_sparse_indices`` for C128A (decode indices
    already global, their lengths given; every token its own request):
    each row is ``window_size`` sliding-window columns then
    ``padded = ceil4(max(topk, decode width))`` compressed columns.

    Decode token t: the window columns are ``decode_swa_indices[t]``; the
    compressed columns the decode view's row (-1 past its width); length
    ``window_size + decode_lens[t]``. Prefill token t at position p: the
    window's slots through its ``swa_block_table`` row (-1 past the window);
    compressed column j the prefill view's local index through its
    ``compressed_block_table`` row for j < n = min((p + 1) // R, topk),
    else -1; length ``window_size + n``."""
    d = decode_swa_indices.shape[0]
    p = prefill_local.shape[0]
    decode_width = decode_compressed.shape[1] if d else 0
    padded = -(-max(topk, decode_width) // 4) * 4
    rows = d + p
    indices = torch.full((rows, window_size + padded), SENTINEL, dtype=torch.int32)
    lens = torch.zeros(rows, dtype=torch.int32)
    if d:
        indices[:d, :window_size] = decode_swa_indices.to(torch.int32)
        indices[:d, window_size : window_size + decode_width] = decode_compressed.to(torch.int32)
        lens[:d] = window_size + decode_lens.to(torch.int32)
    if p:
        pos = positions[d:].long()
        start, length = _window(pos, window_size)
        columns = torch.arange(window_size)
        in_window = columns[None, :] < length[:, None]
        token_positions = start[:, None] + columns[None, :]
        swa = _slots(torch.where(in_window, token_positions, -1), swa_block_table[d:],
                     swa_block_size)
        indices[d:, :window_size] = swa
        n = torch.minimum(torch.div(pos + 1, compress_ratio, rounding_mode="floor"),
                          torch.tensor(topk))
        columns = torch.arange(topk)
        local = prefill_local.long()[:, :topk]
        local = torch.where(columns[None, :] < n[:, None], local, torch.full_like(local, -1))
        indices[d:, window_size : window_size + topk] = _slots(local, compressed_block_table[d:],
                                                               block_size)
        lens[d:] = (window_size + n).to(torch.int32)
    return indices, lens


def combine_swa(topk_indices, positions, window_size, compress_ratio, topk, m, n):
    """``combine_topk_swa_indices`` (every token its own request, the whole
    sequence gathered): row q holds its first k = min((p + 1) // R, topk)
    top-k indices plus ``m * q``, then the window's gathered positions
    ``m * q + n + s`` for s in [max(p - window + 1, 0), p]; length k plus
    the window's length; -1 elsewhere, in ceil128(topk + window) columns."""
    p = topk_indices.shape[0]
    width = -(-(topk + window_size) // 128) * 128
    indices = torch.full((p, width), SENTINEL, dtype=torch.int64)
    pos = positions.long()
    k = torch.minimum(torch.div(pos + 1, compress_ratio, rounding_mode="floor"),
                      torch.tensor(topk))
    start, length = _window(pos, window_size)
    base = m * torch.arange(p)
    for q in range(p):
        kq, lq = int(k[q]), int(length[q])
        indices[q, :kq] = topk_indices[q, :kq].long() + base[q]
        indices[q, kq : kq + lq] = base[q] + n + start[q] + torch.arange(lq)
    return indices.to(torch.int32), (k + length).to(torch.int32)


def short_context_fill(positions, topk, compress_ratio):
    """``fill_short_context_topk_indices``: row t is j for j < (p + 1) // R
    and -1 for the rest of its ``topk`` columns (what the builder's prefill
    row holds at W = topk); the whole row is published."""
    n = torch.div(positions.long() + 1, compress_ratio, rounding_mode="floor")
    columns = torch.arange(topk)
    indices = torch.where(columns[None, :] < n[:, None], columns[None, :], -1)
    return indices.to(torch.int32), None
