"""Steering: how a row's bucket becomes a value, one small function a dimension.

The decisions of :func:`~c128a.strategies.engine.batches` draw each value
from the step's bytes, then hand it here with the row (a
:class:`~.schedule.Steer`): each function returns the drawn value where
the row names no bucket for its dimension or the value is already in it,
else a value in the bucket the step can take, read from the same drawn
value (so that a steered step stays a pure function of its bytes). A
dimension whose value is drawn in one place needs one such function and a
call where it is drawn; a dimension no function steers is left to chance
and to the other rows.
"""

from __future__ import annotations

import numpy as np

from ..contract import MAX_CAPACITY, MAX_MODEL_LEN, WIDTH_ALIGNMENT
from .constraints import ENGINE_DECODE_TOKENS, INTERVALS
from .reach import floors_wrong, is_power_of_two
from .schedule import Steer

INF = 1 << 62


def _span(dimension: str, bucket: str | None) -> tuple[int, int] | None:
    return None if bucket is None else INTERVALS[dimension][bucket]


def _cut(value: int, span: tuple[int, int]) -> int:
    return min(max(value, span[0]), span[1])


# ---------------------------------------------------------------- geometry


def ratio_range(steer: Steer, max_capacity: int = MAX_CAPACITY) -> tuple[int, int]:
    """The compress ratios R with which the row's capacity, width, position
    magnitude and longest list can hold together (C = ceil(L / R) rounded
    to 128, L <= 1,048,576, C <= ``max_capacity``, the step's scale's)."""
    low, high = 1, 1 << 16
    positions = _span("position magnitude", steer.get("position magnitude"))
    width = _span("width W", steer.get("width W"))
    longest = _span("longest list n(t)", steer.get("longest list n(t)"))
    if positions:
        # The largest position p < L <= C x R.
        low = max(low, -(-(positions[0] + 1) // max_capacity))
        if steer.get("capacity C") == "128":
            low = max(low, -(-(positions[0] + 1) // WIDTH_ALIGNMENT))
    if width and width[0] > WIDTH_ALIGNMENT:
        # C >= W: L > (W - 128) R.
        high = min(high, MAX_MODEL_LEN // (width[0] - WIDTH_ALIGNMENT))
    if steer.get("capacity C") not in (None, "128"):
        high = min(high, MAX_MODEL_LEN // (WIDTH_ALIGNMENT + 1))
    if longest and longest[0] > 0:
        high = min(high, MAX_MODEL_LEN // longest[0])
    if longest == (0, 0) and positions:
        low = max(low, positions[0] + 2)  # every p + 1 < R
    if steer.get("first scheduled position") == "1,048,576 and more":
        # Past the caps, C <= 16,384 columns hold positions past 2^20 at R > 64 only.
        low = max(low, 65)
    least_list = _least_decode_list(steer)
    if least_list and positions:
        high = min(high, (positions[1] + 1) // least_list)  # a decode list that long
    return low, max(low, high)


def _least_decode_list(steer: Steer) -> int:
    """The shortest longest decode list the row's decode list against B and
    division by B ask for: past one block, past the first column whose page
    floors wrong (41 for the block sizes below 128 that do)."""
    block = _span("block size B", steer.get("block size B"))
    if block is None:
        return 0
    least = 0
    if steer.get("longest decode list against B") == "longer than one block":
        least = block[0] + 1
    if steer.get("float32 division by B") == "floors a column's page wrong":
        least = max(least, (41 if block[0] < 41 else block[0]) + 1)
    return least


def ratio(kind: int, drawn: int, value: int, steer: Steer,
          max_capacity: int = MAX_CAPACITY) -> int:
    """R of ``kind`` (:data:`~c128a.strategies.engine.RATIO_KINDS`) within
    :func:`ratio_range`; one whose float32 reciprocal floors a multiple of
    R wrong where the row asks for that."""
    low, high = ratio_range(steer, max_capacity)
    wrong = steer.get("float32 division by R") == "floors a token's length wrong"
    if low <= drawn <= high and not (wrong and not floors_wrong(np.array([drawn]), drawn)):
        return drawn
    if kind in (0, 1):
        return drawn
    if kind in (2, 3):
        powers = [1 << k for k in ((range(1, 7)) if kind == 2 else range(8, 17))
                  if low <= 1 << k <= high]
        return powers[value % len(powers)] if powers else drawn
    top = min(high, (1 << 16) - 1)
    if low > top:
        return drawn
    candidate = low + value % (top - low + 1)
    candidate += is_power_of_two(candidate) and candidate < top
    if wrong:
        for offset in range(512):
            inexact = low + (candidate - low + offset) % (top - low + 1)
            if not is_power_of_two(inexact) and floors_wrong(np.array([inexact]), inexact):
                return inexact
    return candidate


def block_size(kind: int, drawn: int, value: int, capacity: int, steer: Steer) -> int:
    """B of ``kind``: above 128, one a decode list can pass within the
    row's width where the row asks for lists longer than a block; one
    whose float32 reciprocal floors a column's page wrong
    (:func:`~.reach.floors_wrong`) where the row asks for that."""
    wrong = steer.get("float32 division by B") == "floors a column's page wrong"
    longer = steer.get("longest decode list against B") == "longer than one block"
    width = _span("width W", steer.get("width W"))
    top = max(capacity, 2 * WIDTH_ALIGNMENT)
    if kind == 3 and (wrong or longer) and width:
        top = min(top, max(width[1] - 1, WIDTH_ALIGNMENT + 1))  # a list past B within W
        if drawn > top:
            drawn = WIDTH_ALIGNMENT + 1 + value % (top - WIDTH_ALIGNMENT)
    if not wrong or floors_wrong(np.array([drawn]), drawn):
        return drawn
    low, high = {3: (WIDTH_ALIGNMENT + 1, top),
                 4: (41, WIDTH_ALIGNMENT - 1)}.get(kind, (drawn, drawn))
    for offset in range(high - low + 1):
        candidate = low + (value + offset) % (high - low + 1)
        if not is_power_of_two(candidate) and floors_wrong(np.array([candidate]), candidate):
            return candidate
    return drawn


def first_wrong_column(block: int, limit: int = MAX_CAPACITY) -> int | None:
    """The first column j (B <= j < ``limit``) whose page j // B a float32
    reciprocal of B floors wrong, None when none does."""
    if is_power_of_two(block) or block >= limit:
        return None
    columns = np.arange(block, limit, dtype=np.int64)
    reciprocal = np.float32(1.0) / np.float32(block)
    wrong = (columns.astype(np.float32) * reciprocal).astype(np.int64) != columns // block
    found = np.flatnonzero(wrong)
    return int(columns[found[0]]) if len(found) else None


def wrong_multiple(ratio_: int, low: int, high: int) -> int | None:
    """A length L in [low, high] whose quotient L / R a float32 reciprocal
    of R floors wrong (the largest such multiple of R), None when none is."""
    if is_power_of_two(ratio_) or high < max(low, ratio_):
        return None
    multiples = np.arange(high // ratio_, max(-(-low // ratio_), 1) - 1, -1, dtype=np.int64)
    lengths = multiples[:4096] * ratio_
    reciprocal = np.float32(1.0) / np.float32(ratio_)
    wrong = (lengths.astype(np.float32) * reciprocal).astype(np.int64) != lengths // ratio_
    found = np.flatnonzero(wrong)
    return int(lengths[found[0]]) if len(found) else None


# ---------------------------------------------------------------- lengths


def _largest_power_of_two(value: int) -> int:
    return 1 << (value.bit_length() - 1)


def longest_range(steer: Steer, ratio_: int) -> tuple[int, int]:
    """The longest sequence (last position + 1 of any token) the row's
    longest list, position magnitude, width and width against need ask for:
    n = floor(L / R) in the list's bucket; L - 1 in the positions' bucket;
    under the policy's width W > 128, n in (W / 2, W]; narrower than the
    list, n > W; wider than the policy's, n <= W / 2."""
    low, high = 1, INF
    longest = _span("longest list n(t)", steer.get("longest list n(t)"))
    width = _span("width W", steer.get("width W"))
    against = steer.get("width against need")
    if longest:
        low = max(low, longest[0] * ratio_)
        if width is None or longest[1] < width[0]:  # not clamped by W
            high = min(high, (longest[1] + 1) * ratio_ - 1)
    positions = _span("position magnitude", steer.get("position magnitude"))
    if positions:
        low, high = max(low, positions[0] + 1), min(high, positions[1] + 1)
    if width:
        top = _largest_power_of_two(min(width[1], MAX_CAPACITY))
        if against == "the policy's width" and width[1] > WIDTH_ALIGNMENT:
            low = max(low, (width[0] // 2 + 1) * ratio_)
            high = min(high, (top + 1) * ratio_ - 1)
        elif against == "the policy's width":
            high = min(high, (WIDTH_ALIGNMENT + 1) * ratio_ - 1)
        elif against == "narrower than the longest list (clamps)":
            low = max(low, (width[0] + 1) * ratio_)
        elif against == "wider than the policy's, below C":
            high = min(high, (top // 2 + 1) * ratio_ - 1)
    return low, high


def decode_range(steer: Steer, ratio_: int, block: int) -> tuple[int, int]:
    """The longest decode sequence the row's decode list against B, its
    float32 division by B and its block-table width ask for (a table of 17
    pages or more where the lists allow; :func:`table_width` adds junk
    columns where they do not)."""
    low, high = 1, INF
    table = steer.get("block-table width M")
    if table == "1-16":
        high = 13 * block * ratio_  # 13 pages and up to 3 junk columns
    against = steer.get("longest decode list against B")
    if against == "0 entries":
        high = max(ratio_ - 1, 1)
    elif against == "within one block":
        low, high = ratio_, (block + 1) * ratio_ - 1
    elif against == "longer than one block":
        low = (block + 1) * ratio_
    if steer.get("float32 division by B") == "floors a column's page wrong":
        column = first_wrong_column(block)
        if column is not None:
            low = max(low, (column + 1) * ratio_)
    pages = {"17-256": 17, "above 256": 257}.get(table)
    if pages and max(low, pages * block * ratio_) <= min(high, MAX_MODEL_LEN):
        low = max(low, pages * block * ratio_)
    return low, high


def model_length_range(steer: Steer, ratio_: int, block: int) -> tuple[int, int]:
    """The model lengths L the row's sequences and capacity ask for: long
    enough for its longest sequences, C = ceil(L / R) rounded to 128 above
    W, or W itself for the width against need 'C'."""
    low = max(longest_range(steer, ratio_)[0], decode_range(steer, ratio_, block)[0])
    high = MAX_MODEL_LEN
    width = _span("width W", steer.get("width W"))
    against = steer.get("width against need")
    if width and against == "C":
        low = max(low, (width[0] - WIDTH_ALIGNMENT) * ratio_ + 1)
        high = min(high, width[1] * ratio_)
    elif width and against is not None:
        low = max(low, width[0] * ratio_ + 1)  # C > W
    elif width:
        low = max(low, (width[0] - WIDTH_ALIGNMENT) * ratio_ + 1)  # C >= W
    if steer.get("capacity C") == "128":
        high = min(high, WIDTH_ALIGNMENT * ratio_)
    elif steer.get("capacity C") is not None:
        low = max(low, WIDTH_ALIGNMENT * ratio_ + 1)
    if wide_small_step(steer):
        low = max(low, (WIDE_COLUMNS - WIDTH_ALIGNMENT) * ratio_ + 1)  # C >= 4,096
    return low, high


WIDE_COLUMNS = 4_096
"""The width a small step of many elements aims for: 17 tokens of it pass 65,536."""
WIDE_TOKENS = 17


def wide_small_step(steer: Steer) -> bool:
    """Whether the row asks for more than 65,536 elements of a step of at
    most 64 tokens: then a width of 4,096 columns or more and 17 tokens."""
    elements = _span("elements T x W", steer.get("elements T x W"))
    tokens = _span("tokens T", steer.get("tokens T"))
    return bool(elements and tokens and elements[0] > 65_536 and tokens[1] <= 64)


def widest_width(steer: Steer) -> bool:
    """Whether the row's elements ask for its width bucket's widest W: a
    small step of many elements, or an engine-scale step of a million."""
    elements = _span("elements T x W", steer.get("elements T x W"))
    return wide_small_step(steer) or bool(elements and elements[0] > 1 << 20)


def model_length(length: int, ratio_: int, value: int, low: int, most: int,
                 steer: Steer) -> int:
    """L of the row's model-length bucket with the capacity L gives, within
    [low, most]: a multiple of R; not one, where flooring L / R to whole
    tiles changes C (L = 128 k R + r, 0 < r < R); not one, C the same
    either way."""
    wanted = steer.get("model length")
    if wanted is None or ratio_ < 2:
        return length
    entries = -(-length // ratio_)
    tiles = -(-entries // WIDTH_ALIGNMENT)
    floored = length // ratio_
    changes = length % ratio_ != 0 and floored >= WIDTH_ALIGNMENT and floored % WIDTH_ALIGNMENT == 0
    if wanted == "a multiple of R":
        candidates = [] if length % ratio_ == 0 else [entries * ratio_]
    elif wanted == "not a multiple of R, rounding down changes C":
        candidates = [] if changes or tiles < 2 else [
            WIDTH_ALIGNMENT * (tiles - 1) * ratio_ + 1 + value % (ratio_ - 1)]
    elif length % ratio_ and not changes:
        candidates = []
    elif changes:
        candidates = [length + ratio_]  # floor past the tile's first entry
    else:
        candidates = [length - 1] if entries % WIDTH_ALIGNMENT != 1 else [length + 1]
    for candidate in candidates:
        if max(low, 1) <= candidate <= most:
            return candidate
    return length


# ---------------------------------------------------------------- padding, tables, history

SLOT_KINDS = 8
"""Padding slots a slot byte picks from (the engine's PADDING_SLOTS: -1 for
the first four, below -1 for the rest)."""


def slot_index(index: int, steer: Steer) -> int:
    """A padding slot's index in PADDING_SLOTS in the row's padding-slot bucket."""
    wanted = steer.get("padding slot")
    if wanted == "-1" and index >= SLOT_KINDS // 2:
        return index % (SLOT_KINDS // 2)
    if wanted == "below -1" and index < SLOT_KINDS // 2:
        return SLOT_KINDS // 2 + index
    return index


def tail_byte(byte: int, count_kinds: int, stale_from: int, steer: Steer) -> int:
    """The tail-padding byte (count, slot and staleness in one byte) with
    the row's padding slot and padding position: stale positions from
    ``stale_from``, a slot index below 4 for -1."""
    stale = steer.get("padding position")
    count, rest = byte % count_kinds, byte // count_kinds
    index = slot_index(rest % SLOT_KINDS, steer)
    wants_stale = byte >= stale_from if stale is None else stale == "stale, past its request"
    if wants_stale:
        # Stale bytes hold slot indices 0 to 4 (4 is -2) and counts to 3 at index 4.
        index = min(index, 4)
        byte = stale_from + index * count_kinds + (min(count, 3) if index == 4 else count)
        return min(byte, 255)
    return (rest // SLOT_KINDS % (stale_from // count_kinds // SLOT_KINDS)) * count_kinds * SLOT_KINDS \
        + index * count_kinds + count


def inside_token(token: int, real_tokens: int, request_ends: set[int], steer: Steer) -> int:
    """A token padded inside, for the row's padding position: one that ends
    a request of several tokens (its position is past the request's real
    ones, stale) or one that does not."""
    wanted = steer.get("padding position")
    if wanted == "stale, past its request":
        ends = sorted(t for t in request_ends if t < real_tokens - 1) or sorted(request_ends)
        return ends[token % len(ends)] if ends and token not in ends else token
    if wanted == "within its request" and token in request_ends:
        return token - 1  # the request's token before its last
    return token


def sliced_table(drawn: int, steer: Steer) -> int:
    """The wider-table byte: odd for a slice of a wider table."""
    wanted = steer.get("block table")
    if wanted == "slice of a wider table":
        return drawn | 1
    if wanted == "dense":
        return drawn & ~1
    return drawn


def table_width(width: int, value: int, steer: Steer) -> int:
    """Block-table columns M in the row's bucket where they can only grow:
    columns past every row's need are junk a correct builder never reads."""
    span = _span("block-table width M", steer.get("block-table width M"))
    if span is None or width >= span[0]:
        return width
    return span[0] + value % 16


def prior_width(earlier: int, value: int, width: int, capacity: int, reachable: list[int],
                steer: Steer) -> int:
    """The width built before (``earlier``; 0: the widest, C) in the row's
    width-history bucket: the same W, a wider one, or a narrower one."""
    wanted = steer.get("width history")
    before = earlier or capacity
    if wanted == "same W" and before != width:
        return width
    if wanted == "narrower than the last build" and before <= width:
        wider = [w for w in reachable if width < w <= capacity]
        return wider[value % len(wider)] if wider else earlier
    if wanted == "wider than the last build" and before >= width:
        narrower = [w for w in reachable if w < width] or list(
            range(WIDTH_ALIGNMENT, width, WIDTH_ALIGNMENT))
        return narrower[value % len(narrower)] if narrower else earlier
    return earlier


ROW_KINDS = {"same": 0, "fewer, same 64-row block": 1, "fewer, across a 64-row block": 2,
             "more, same 64-row block": 3, "more, across a 64-row block": 4}
GEOMETRY_KINDS = {"same R and B": 0, "another R": 1, "another B": 2, "another R and B": 3}
PLACEMENT_KINDS = {"same placement": 0, "decode and prefill buffers swapped": 1,
                   "buffers from a row offset": 2}


def history_kind(kind: int, dimension: str, kinds: dict[str, int], steer: Steer) -> int:
    """A shape-history kind byte in the row's bucket of ``dimension``."""
    wanted = steer.get(dimension)
    if wanted is None or kind % len(kinds) == kinds[wanted]:
        return kind
    return kinds[wanted]


def same_tokens(kind: int, steer: Steer) -> int:
    """The split byte: odd to keep the step's T with another split."""
    wanted = steer.get("tokens history")
    if wanted == "same T" and steer.get("decode rows history") not in (None, "same"):
        return kind | 1
    if wanted in ("fewer tokens", "more tokens"):
        return kind & ~1
    return kind


def address_reuse(kind: int, one_in: int, steer: Steer) -> int:
    """The split byte, whose bits above the lowest pick address reuse one
    time in ``one_in``, in the row's address-reuse bucket."""
    wanted = steer.get("address reuse")
    reused = (kind >> 1) % one_in == one_in - 1
    if wanted is None or reused == (wanted != "same geometry"):
        return kind
    low = kind & 1
    return ((one_in - 1) << 1 | low) if wanted != "same geometry" else low


# ---------------------------------------------------------------- tokens and requests

QUERY = 8  # the most query tokens of a decode request (MAX_QUERY_TOKENS_PER_DECODE)


def _meet(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    low, high = max(a[0], b[0]), min(a[1], b[1])
    return (low, high) if low <= high else None


def token_ranges(steer: Steer) -> tuple[tuple[int, int], tuple[int, int]]:
    """(decode tokens, prefill tokens) the row's mix, decode rows and
    prefill tokens ask for."""
    mix = steer.get("decode/prefill mix")
    decode = _span("decode rows", steer.get("decode rows")) or (0, INF)
    prefill = _span("prefill tokens", steer.get("prefill tokens")) or (0, INF)
    if mix in ("no tokens", "prefill only"):
        decode = (0, 0)
    elif mix in ("decode only", "decode + prefill"):
        decode = (max(decode[0], 1), decode[1])
    if mix in ("no tokens", "decode only"):
        prefill = (0, 0)
    elif mix in ("prefill only", "decode + prefill"):
        prefill = (max(prefill[0], 1), prefill[1])
    return decode, prefill


def token_hint(steer: Steer, max_elements: int | None = None) -> tuple[int, int]:
    """The token counts T the row's decode rows, prefill tokens and
    requests hold together: decode rows + prefill tokens, at least a token
    a request, at most 8 decode tokens a request and 8 padding tokens; and
    with ``max_elements`` (an engine-scale step's T x C) few enough for the
    row's width and capacity."""
    decode, prefill = token_ranges(steer)
    requests = _span("requests", steer.get("requests")) or (0, INF)
    most_decode = min(decode[1], (min(requests[1], INF) + 1) * QUERY, ENGINE_DECODE_TOKENS)
    low, high = max(decode[0] + prefill[0], requests[0]), most_decode + prefill[1]
    if max_elements:
        columns = max((_span("width W", steer.get("width W")) or (0, 0))[0],
                      (_span("capacity C", steer.get("capacity C")) or (0, 0))[0])
        if columns > WIDTH_ALIGNMENT:
            high = min(high, max_elements // columns - 2 * QUERY)
    return low, high


def decode_tokens(tokens: int, steer: Steer, value: int) -> tuple[int, int] | None:
    """The decode tokens of an engine-scale step of ``tokens`` tokens (tail
    padding aside) the row's buckets allow: within its decode rows, leaving
    the prefill tokens its bucket asks for; None where none does."""
    decode, prefill = token_ranges(steer)
    within = _meet(decode, (tokens - prefill[1], tokens - prefill[0]))
    within = within and _meet(within, (0, tokens))
    if within is None:
        return None
    return within


def request_ranges(steer: Steer, decode: tuple[int, int] | None,
                   prefill_most: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(decode requests, prefill requests) for ``decode`` decode tokens (the
    row's decode rows where None) and the row's request count: each decode
    request holds 1 to 8 tokens (1 where it asks for one token a request),
    each prefill request 1 token or more, ``prefill_most`` at most."""
    tokens, prefill = token_ranges(steer)
    tokens = decode or tokens
    one = steer.get("speculative decode") == "1 token a request"
    decode_requests = (tokens[0] if one else -(-tokens[0] // QUERY), min(tokens[1], INF))
    prefill_requests = (1 if prefill[0] else 0, min(prefill[1], prefill_most))
    requests = _span("requests", steer.get("requests"))
    if requests:
        decode_requests = _meet(decode_requests, (requests[0] - prefill_requests[1],
                                                  requests[1] - prefill_requests[0])) or decode_requests
        prefill_requests = _meet(prefill_requests, (requests[0] - decode_requests[1],
                                                    requests[1] - decode_requests[0])) or prefill_requests
    return decode_requests, prefill_requests
