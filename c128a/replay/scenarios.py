"""The replay scenarios: engine steps, each padded to a capture size, that a
harness captured at W = C runs one after another.

Shared by the conformance replay tests (:mod:`c128a.conformance.test_replay`),
which run them on the selected target, and the project's own tests, which
run them on the mutants the replay must catch.
"""

from __future__ import annotations

from ..contract import COMPRESS_RATIO
from ..step import Batch
from .harness import ReplayHarness

R = COMPRESS_RATIO
SMALL_MODEL_LEN = 81_920  # capacity 640: widths 128, 256, 512, 640
LONG_MODEL_LEN = 1_048_576  # capacity 8192
NUM_PAGES = 8192


def harness_for(target, device, max_model_len=SMALL_MODEL_LEN, **options) -> ReplayHarness:
    """A harness with capture sizes up to 8 and a KV table of ``2 * NUM_PAGES`` slots."""
    return ReplayHarness(
        target,
        device,
        max_model_len=max_model_len,
        kv_slots=2 * NUM_PAGES,
        capture_limit=8,
        **options,
    )


def step(harness: ReplayHarness, decode=(), prefill=()) -> Batch:
    """A padded step: ``decode`` is (request, position) per decode token (decode
    tokens of one request must be adjacent), ``prefill`` the prefill positions.
    Request r owns pages 1000 * r + k (distinct across requests)."""
    requests = list(dict.fromkeys(request for request, _ in decode))
    positions = [p for _, p in decode] + list(prefill)
    pages = -(-(max(positions) + 1) // 256)
    table = tuple(
        tuple((1000 * r + k) % NUM_PAGES for k in range(pages)) for r in requests
    )
    batch = Batch(
        positions=tuple(positions),
        num_decode_tokens=len(decode),
        token_to_req_indices=tuple(requests.index(r) for r, _ in decode) + (0,) * len(prefill),
        block_table=table,
        slot_mapping=tuple(positions),
        max_model_len=harness.max_model_len,
        capacity=harness.capacity,
        width=harness.target.active_topk_width(max(positions) + 1, R, harness.capacity),
        buffer_rows=harness.rows,
    )
    return harness.pad(batch)


def top_of_band(width: int) -> int:
    """The position whose list is exactly ``width`` entries long: n(t) == W."""
    return width * R - 1


# Step sequences, each step (decode, prefill). All run after capture at W = C.
SCENARIOS = {
    "decode rows below capacity": [([(0, 300), (1, 1000), (2, 20000)], [])],
    "mixed decode and prefill": [([(0, 16000), (1, 5000)], [40000, 40001, 200])],
    "speculative tokens of one request": [([(0, p) for p in range(30000, 30008)], [])],
    "width up then down": [
        ([(0, 100)], []),
        ([(0, 101), (1, SMALL_MODEL_LEN - 2)], []),
        ([(0, 102), (2, 20000), (3, 9000)], [700]),
    ],
    # n(t) == W == 128 < W_capture: no -1 before W (the stale-sentinel hazard,
    # which --c128a-strict-sentinels turns into a failure).
    "a row exactly W long": [([(0, 128 * R - 1), (1, 5000)], [])],
    "padding tokens and stale rows": [
        ([(0, 60000), (1, 60000), (2, 60000)], [60000] * 5),
        ([(0, 1000)], [300]),
    ],
}


def run_scenario(harness: ReplayHarness, steps) -> list:
    return [harness.run_step(step(harness, decode, prefill)) for decode, prefill in steps]
