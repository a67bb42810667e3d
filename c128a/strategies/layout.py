"""Steps decoded from byte strings.

A step is decoded from two byte strings, its layout (everything but the
requests, fixed size) and its requests (:data:`REQUEST_BYTES` each): two
Hypothesis choices instead of about twenty, each costing tens of
microseconds, which at 512 tokens made drawing most of an example's time.
Zero bytes decode to the simplest value (no requests, one query token, the
shortest sequence, no padding, identity pages, the policy's width), and
Hypothesis shrinks bytes towards zeros and the request counts towards
fewer, so shrinking still ends at the smallest step.
"""

from __future__ import annotations

from ..contract import MAX_QUERY_TOKENS_PER_DECODE

REQUEST_BYTES = 6  # query length (2), edge selector (1), sequence length (3)
PAD_BYTES = 5  # source token (2), position (3)
INDEX_BYTES = 2
SLOT_BYTES = 3
TABLE_BYTES = 12  # junk columns (1), scale (3), offset (3), junk kind (1), junk (4)
MODEL_LEN_BYTES = 5  # kind (2), value (3)
MAX_INSIDE_PADDING = 3
MAX_JUNK_SLOTS = 3
LAYOUT_BYTES = (
    MODEL_LEN_BYTES
    + 2 + 2  # decode and prefill request counts
    + 1 + 2  # width kind and value
    + 1 + MAX_QUERY_TOKENS_PER_DECODE * PAD_BYTES  # tail padding
    + 1 + MAX_INSIDE_PADDING * INDEX_BYTES  # padding inside
    + 1 + MAX_JUNK_SLOTS * SLOT_BYTES  # slot_mapping entries past T
    + TABLE_BYTES
    + 1 + 1  # the table's row stride: wider or not, by how much
    + 2  # buffer rows
    + 1  # prefill buffer wider or not
)
SHAPE_BYTES = (
    1 + 2  # scale: small or engine-scale, and the engine-scale token count
    + 1 + 1 + 2 + 1 + 2  # geometry drawn or not; R's kind and value; B's kind and value
    + 1 + 1 + 2  # buffer layout: kind, storage offset, row padding
    + 1 + 1  # prior width (history_independent): kind, value
)


def uint(data: bytes) -> int:
    return int.from_bytes(data, "big")


def signed(value: int, bound: int) -> int:
    """``value`` folded into [-bound, bound], zero first: 0, -1, 1, -2, 2, ..."""
    value %= 2 * bound + 1
    return -(value + 1) // 2 if value % 2 else value // 2


class Fields:
    """Unsigned big-endian fields read off a drawn byte string, in order."""

    def __init__(self, data: bytes):
        self.data = data
        self.offset = 0

    def take(self, size: int) -> bytes:
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def uint(self, size: int) -> int:
        return uint(self.take(size))

    def between(self, size: int, low: int, high: int) -> int:
        """A value in [low, high] from ``size`` bytes; zeros give ``low``."""
        return low + self.uint(size) % (high - low + 1)
