"""The contract's sizes and constants (CONTRACT.md, "Sizes"), named once."""

from __future__ import annotations

COMPRESS_RATIO = 128
"""R: tokens per compressed KV entry in DeepSeek-V4's C128A layers."""

PAGE_TOKENS = 256
"""Tokens in one KV page."""

BLOCK_SIZE = PAGE_TOKENS // COMPRESS_RATIO
"""B: compressed entries per KV page (2)."""

WIDTH_ALIGNMENT = 128
"""Every width and capacity is a multiple of this (FlashMLA's decode tile)."""

DEFAULT_WIDTH = 8192
"""``max_compressed_tokens``'s default in vLLM's signature."""

MAX_MODEL_LEN = 1_048_576
"""The longest ``max_model_len`` of the contract (1M context, capacity 8,192)."""

MAX_CAPACITY = 8192
"""The capacity at :data:`MAX_MODEL_LEN`: the widest buffer the contract knows."""

MAX_QUERY_TOKENS_PER_DECODE = 8
"""One decode token plus up to 7 speculative draft tokens."""

SENTINEL = -1
"""What a column j >= n(t) holds."""
