"""CUDA-graph replay: a captured consumer of the metadata, checked against the oracle.

The decode attention kernel runs inside FULL CUDA graphs, so it reads the
metadata through the pointer, shape and strides it was given at capture, not
through the views a later step returns. :class:`ReplayHarness` replays that
situation:

1. The persistent buffers are allocated once. For every capture size S
   (1, 2, 4, 8, ... up to a limit, as vLLM captures) the engine's capture batch
   is built into them (max_seq_len = max_model_len, so W = capacity per the
   target's policy) and a consumer (:mod:`c128a.replay.consumer`) is captured
   on the returned views, its geometry frozen then: S decode rows of
   ``global_decode`` with ``decode_lens``, and S prefill rows of
   ``prefill_local`` (whose lengths the prefill combiner knows from the
   positions; a static input here).
2. Each later step is padded to the smallest capture size that fits (padding
   tokens have negative ``slot_mapping``), built eagerly into the same buffers
   at its own W, and the captured consumer is replayed.
3. The consumer's output must equal the oracle consumer's, computed from the
   oracle's result for that step (under the padding-row variant the target
   is held to: :mod:`c128a.contract.padding_rows`); and the index window the
   consumer sees (rows < S, columns < W_capture) must be what the contract
   leaves there: the oracle's values where the step writes, the earlier
   bytes elsewhere.

Optional, off by default (``--c128a-strict-sentinels``): a consumer that trusts
the -1 sentinel instead of ``decode_lens`` reads each row up to its first -1
within the captured width; columns [W, W_capture) were not written by the
step, so it may read stale indices.
:class:`~c128a.failures.StaleSentinelHazard` reports it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import phases
from ..checks.diff import first_difference
from ..checks.prior_shape import earlier_buffers, shaped_earlier_step
from ..contract import (
    BLOCK_SIZE,
    COMPRESS_RATIO,
    attended_lengths,
    padding_rows_of,
    target_capacity,
    target_width,
)
from ..contract.validation import check
from ..failures import BadArgument, ReplayMismatch, StaleSentinelHazard
from ..step import Batch, Buffers, BuildResult, StepRequest, assemble_batch, build, oracle_build
from ..step.buffers import copy_into, to_host
from .consumer import (
    ConsumerOutput,
    Geometry,
    consume,
    freeze,
    kv_table,
    make_consumer,
    sentinel_lengths,
)

DEFAULT_CAPTURE_LIMIT = 32
MODES = ("auto", "emulate", "cuda")
SECTIONS = ("decode", "prefill")


def capture_sizes(limit: int = DEFAULT_CAPTURE_LIMIT) -> tuple[int, ...]:
    """Token counts with a captured graph: 1, 2, 4, 8, ... up to ``limit``
    (``limit`` itself is included when it is not a power of two)."""
    check(
        isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1,
        f"limit={limit!r} must be an int >= 1",
    )
    sizes = [1 << k for k in range(limit.bit_length()) if 1 << k <= limit]
    if sizes[-1] != limit:
        sizes.append(limit)
    return tuple(sizes)


def padded_size(count: int, sizes: tuple[int, ...]) -> int:
    """The smallest capture size that holds ``count`` tokens."""
    for size in sizes:
        if size >= count:
            return size
    raise BadArgument(
        f"count={count} tokens exceed the largest capture size {sizes[-1]}; "
        "capture more sizes (a larger capture limit) or schedule fewer tokens"
    )


def pad_decode_to_capture_size(batch: Batch, sizes: tuple[int, ...]) -> Batch:
    """Append padding decode tokens so that ``num_decode_tokens`` is a capture size.

    Padding tokens sit right after the real decode tokens, as vLLM pads a
    decode-only batch: position 0, the last decode token's request, and
    ``slot_mapping`` -1 (so their ``decode_lens`` must be 0).
    """
    num_decode = batch.num_decode_tokens
    if num_decode == 0:
        return batch
    padding = padded_size(num_decode, sizes) - num_decode
    if padding == 0:
        return batch
    d = num_decode
    slots = list(batch.slot_mapping)
    return dataclasses.replace(
        batch,
        positions=batch.positions[:d] + (0,) * padding + batch.positions[d:],
        num_decode_tokens=d + padding,
        token_to_req_indices=batch.token_to_req_indices[:d]
        + (batch.token_to_req_indices[d - 1],) * padding
        + batch.token_to_req_indices[d:],
        slot_mapping=tuple(slots[:d] + [-1] * padding + slots[d:]),
        labels=batch.labels + (f"{padding} padding token(s)",),
    )


def _excerpt(row: torch.Tensor, start: int, count: int = 8) -> str:
    start = max(0, start)
    values = row[start : start + count].tolist()
    more = ", ..." if start + count < row.numel() else ""
    return f"from column {start}: {values}{more}"


# --- the harness ----------------------------------------------------------------


@dataclass
class CapturedSection:
    size: int
    geometry: Geometry  # of the view returned at capture
    consumer: object


@dataclass
class StepOutcome:
    """What one replayed step did (for events and reports)."""

    step: int
    width: int
    sizes: dict[str, int] = field(default_factory=dict)
    hazards: list[str] = field(default_factory=list)


BuildStep = Callable[[Batch, Buffers, Buffers], BuildResult]
"""``build_step(batch, buffers, before)``: build ``batch`` into ``buffers``,
whose contents before the build are ``before`` (a host copy)."""


class ReplayHarness:
    """Persistent buffers, one captured consumer per (section, capture size),
    and :meth:`run_step` to build a step eagerly and replay.

    ``build_step(batch, buffers, before)`` builds a batch with the target
    into the persistent buffers (``before``: their contents on the host); by
    default a plain build, the serving-loop machine passes
    :func:`c128a.checks.check_step`. A step waits for the device three times
    (the buffers before it, the target's build read back, the replays read
    back); the oracle and every comparison run on the host. ``mode`` is
    'cuda' (a real CUDA graph), 'emulate' (frozen ``as_strided`` views) or
    'auto' (CUDA on a CUDA device). ``kv_slots`` sizes the KV table: the
    block tables' page ids times ``block_size`` must fit.
    ``check_window=False`` skips comparing the index window the consumer sees
    (outputs and lens are always compared).
    """

    def __init__(
        self,
        target,
        device: torch.device | str,
        *,
        max_model_len: int,
        kv_slots: int,
        capture_limit: int = DEFAULT_CAPTURE_LIMIT,
        buffer_rows: int | None = None,
        block_size: int = BLOCK_SIZE,
        build_step: BuildStep | None = None,
        mode: str = "auto",
        strict_sentinels: bool = False,
        check_window: bool = True,
    ):
        check(mode in MODES, f"mode={mode!r} must be one of {', '.join(MODES)}")
        self.device = torch.device(device)
        if mode == "auto":
            mode = "cuda" if self.device.type == "cuda" else "emulate"
        check(
            mode != "cuda" or self.device.type == "cuda",
            f"mode='cuda' needs a CUDA device, got device={self.device}; use mode='emulate'",
        )
        self.mode = mode
        self.target = target
        self.padding_rows = padding_rows_of(target)  # what the oracle consumer reads
        self.ratio = COMPRESS_RATIO
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.capacity = target_capacity(target, max_model_len, self.ratio)
        self.capture_width = target_width(target, max_model_len, self.ratio, self.capacity)
        self.sizes = capture_sizes(capture_limit)
        self.rows = max(buffer_rows or 0, self.sizes[-1])
        self.strict_sentinels = strict_sentinels
        self.check_window = check_window
        self.buffers = Buffers.allocate(self.rows, self.capacity, self.device)
        self.kv = kv_table(max(kv_slots, self.capacity), self.device)
        self.kv_on_host = kv_table(self.kv.numel(), "cpu")  # the oracle consumer's
        # The prefill combiner knows each prefill token's list length from the
        # positions; in the graph that is a static input refilled every step.
        self.prefill_lens = torch.zeros(self.rows, dtype=torch.int32, device=self.device)
        self._build_step = build_step or self._plain_build
        self.captured: dict[tuple[str, int], CapturedSection] = {}
        self.steps = 0
        for size in self.sizes:
            self._capture(size)
        self._after_capture = self.buffers.clone()

    def reset(self) -> None:
        """Back to the state right after capture (buffers copied in place, so
        the captured consumers still read them): a fresh engine, no recapture."""
        for buffer, saved in zip(self.buffers.as_tuple(), self._after_capture.as_tuple()):
            buffer.copy_(saved)
        self.prefill_lens.zero_()
        self.steps = 0

    # The capture batch ------------------------------------------------------

    def capture_batch(self, size: int) -> Batch:
        """The engine's capture batch for ``size``: ``size`` decode tokens (what
        vLLM captures) and ``size`` prefill tokens (so the prefill consumer is
        captured on rows too), all at max_seq_len = max_model_len."""
        position = self.max_model_len - 1
        entries = min((position + 1) // self.ratio, self.capture_width)
        pages = -(-entries // self.block_size)
        num_pages = self.kv.numel() // self.block_size
        tokens = StepRequest((position,) * size)
        return assemble_batch(
            [tokens],
            [tokens],
            block_table=(tuple(page % num_pages for page in range(max(pages, 1))),),
            max_model_len=self.max_model_len,
            capacity=self.capacity,
            width=self.capture_width,
            buffer_rows=self.rows,
            block_size=self.block_size,
            labels=(f"capture batch, size {size}",),
        )

    def _plain_build(self, batch: Batch, buffers: Buffers, before: Buffers) -> BuildResult:
        return build(self.target, batch, self.device, buffers=buffers)

    def _capture(self, size: int) -> None:
        result = self._build_step(self.capture_batch(size), self.buffers,
                                  self.buffers.host_copy())
        decode_view, lens_view, prefill_view = result.views
        wc = self.capture_width
        decode = freeze(decode_view, (size, wc), f"capture size {size}: global_decode")
        lens = freeze(lens_view, (size,), f"capture size {size}: decode_lens")
        prefill = freeze(prefill_view, (size, wc), f"capture size {size}: prefill_local")
        self.captured["decode", size] = CapturedSection(
            size, Geometry.of(decode_view), make_consumer(decode, lens, self.kv, self.mode)
        )
        self.captured["prefill", size] = CapturedSection(
            size,
            Geometry.of(prefill_view),
            make_consumer(prefill, self.prefill_lens[:size], self.kv, self.mode),
        )

    # A step -------------------------------------------------------------------

    def pad(self, batch: Batch) -> Batch:
        return pad_decode_to_capture_size(batch, self.sizes)

    def run_step(self, batch: Batch) -> StepOutcome:
        """Build ``batch`` (already padded: :meth:`pad`) into the persistent
        buffers, replay the captured consumers, and check them against the oracle.

        A step that records an earlier step of another shape (``batch.prior``:
        another layer's step through the same buffers) has that step built
        into the buffers first, as recorded
        (:func:`~c128a.checks.prior_shape.shaped_earlier_step`), so a saved
        step replays its history. Raises :class:`~c128a.failures.ReplayMismatch` (or, with strict
        sentinels, :class:`~c128a.failures.StaleSentinelHazard`); whatever
        ``build_step`` raises passes through.
        """
        num_decode, num_prefill = batch.num_decode_tokens, batch.num_prefill_tokens
        check(
            batch.capacity == self.capacity and batch.buffer_rows == self.rows,
            f"batch.capacity={batch.capacity}, batch.buffer_rows={batch.buffer_rows} must match "
            f"the harness's buffers ({self.capacity} columns, {self.rows} rows)",
        )
        check(
            num_decode == 0 or num_decode in self.sizes,
            f"num_decode_tokens={num_decode} is not a capture size {self.sizes}; "
            "pad the batch first (ReplayHarness.pad)",
        )
        self.steps += 1
        if batch.prior is not None:
            # Another layer's step: its own correctness is not this step's check.
            build(self.target, shaped_earlier_step(batch), self.device,
                  buffers=earlier_buffers(self.buffers, batch.prior))
        before = self.buffers.host_copy()
        result = self._build_step(batch, self.buffers, before)
        # The contract's buffers after this step: the earlier bytes, with the
        # oracle's rows < T, columns < W (under the target's padding-row
        # variant) written over them.
        expected = before
        oracle_build(batch, "cpu", buffers=expected, padding_rows=self.padding_rows)

        outcome = StepOutcome(step=self.steps, width=batch.width)
        prefill_lens = torch.zeros(self.rows, dtype=torch.int32)
        if num_prefill:
            prefill_lens[:num_prefill] = attended_lengths(
                torch.tensor(batch.positions[num_decode:]), batch.compress_ratio, batch.width
            ).to(torch.int32)
            # The captured prefill consumer's static input.
            copy_into(self.prefill_lens, prefill_lens)
        replayed = {}
        for section, rows in (("decode", num_decode), ("prefill", num_prefill)):
            if rows:
                size = padded_size(rows, self.sizes)
                outcome.sizes[section] = size
                replayed[section] = (size, rows, self.captured[section, size].consumer.replay())
        # Every replay's output read back at once.
        seen_on_host = iter(to_host([t for _, _, seen in replayed.values()
                                     for t in (seen.indices_seen, seen.lens_seen, seen.gathered)]))
        for section, (size, rows, _) in replayed.items():
            seen = ConsumerOutput(*(next(seen_on_host) for _ in range(3)))
            self._check_section(section, size, rows, batch, result, expected, prefill_lens, seen,
                                outcome)
        return outcome

    def _check_section(self, section, size, rows, batch, result, expected, prefill_lens, seen,
                       outcome) -> None:
        captured = self.captured[section, size]
        wc = self.capture_width
        if section == "decode":
            want_indices = expected.global_decode[:size, :wc]
            want_lens = expected.decode_lens[:size]
        else:
            want_indices = expected.prefill[:size, :wc]
            want_lens = prefill_lens[:size]
        with phases.phase("oracle"):  # the oracle consumer's output: the expected values
            want = consume(want_indices, want_lens, self.kv_on_host)

        context = _Context(self, section, size, rows, batch, result, captured, seen)
        hit = first_difference(seen.gathered, want)
        if hit is not None:
            context.fail("output", hit, want_indices, want_lens, want)
        hit = first_difference(seen.lens_seen, want_lens)
        if hit is not None:
            context.fail("lens", (hit[0], 0), want_indices, want_lens, want)
        mask = None
        if section == "decode" and self.target.full_width_decode_views:
            # Such a target returns (and may fill) all C columns of its rows.
            columns = torch.arange(wc)
            written_rows = torch.arange(size) < rows
            mask = ~(written_rows[:, None] & (columns >= batch.width)[None, :])
        if self.check_window:
            hit = first_difference(seen.indices_seen, want_indices, mask)
            if hit is not None:
                context.fail("window", hit, want_indices, want_lens, want)

        # Only this step's rows: no consumer processes rows past the token count.
        # A sentinel-trusting consumer reads what the lens-bound one reads
        # exactly when its row's first -1 sits at lens.
        stops = sentinel_lengths(seen.indices_seen[:rows])
        hit = first_difference(stops, want_lens[:rows].to(stops.dtype))
        if hit is not None:
            report = context.hazard(hit[0], want_lens)
            if self.strict_sentinels:
                row = hit[0]
                raise StaleSentinelHazard(
                    report,
                    step=self.steps,
                    section=section,
                    row=row,
                    columns=(batch.width, int(sentinel_lengths(seen.indices_seen)[row])),
                )
            outcome.hazards.append(report)


@dataclass
class _Context:
    """Everything a failure report of one section's replay needs."""

    harness: ReplayHarness
    section: str
    size: int
    rows: int
    batch: Batch
    result: BuildResult
    captured: CapturedSection
    seen: ConsumerOutput

    def header(self) -> str:
        b = self.batch
        d = b.num_decode_tokens
        padding = sum(1 for s in b.slot_mapping[:d] if s < 0)
        return (
            f"step {self.harness.steps}, {self.section} consumer captured at size {self.size} "
            f"(W_capture={self.harness.capture_width}, capacity={self.harness.capacity}); "
            f"this step: W={b.width}, {d - padding} decode + {padding} padding + "
            f"{b.num_prefill_tokens} prefill tokens"
        )

    def token(self, row: int) -> str:
        b = self.batch
        if row >= self.rows:
            return f"row {row} (past this step's {self.rows} {self.section} rows: stale)"
        t = row if self.section == "decode" else b.num_decode_tokens + row
        position = b.positions[t]
        n = min((position + 1) // b.compress_ratio, b.width)
        what = f"token {t}: position {position}, n(t)={n}"
        if self.section == "decode":
            what += f", request row {b.token_to_req_indices[t]}, slot_mapping {b.slot_mapping[t]}"
        return f"row {row} ({what})"

    def geometry(self) -> str:
        view = self.result.views[0 if self.section == "decode" else 2]
        name = "global_decode" if self.section == "decode" else "prefill_local"
        return (
            f"the consumer reads {name} through the view frozen at capture "
            f"({self.captured.geometry}); "
            f"this step returned {name} with {Geometry.of(view)}"
        )

    def fail(self, kind, hit, want_indices, want_lens, want) -> None:
        row, column = hit
        seen = self.seen
        lines = [
            f"replay mismatch ({kind}) at {self.header()}",
            f"  {self.token(row)}, column {column}:",
        ]
        if kind == "output":
            lines.append(
                f"    consumer read index {int(seen.indices_seen[row, column])} -> "
                f"{int(seen.gathered[row, column])}; oracle: index "
                f"{int(want_indices[row, column])} -> {int(want[row, column])}"
            )
        elif kind == "lens":
            lines.append(
                f"    consumer read lens {int(seen.lens_seen[row])}; oracle: {int(want_lens[row])}"
            )
        else:
            lines.append(
                f"    consumer sees index {int(seen.indices_seen[row, column])} where the contract "
                f"leaves {int(want_indices[row, column])} "
                + ("(a column >= W the step must not write)" if column >= self.batch.width
                   else "(a column < W the step writes)")
            )
        lines.append(
            f"    consumer saw lens {int(seen.lens_seen[row])}, oracle lens {int(want_lens[row])}"
        )
        lines.append(f"    consumer saw indices {_excerpt(seen.indices_seen[row], column - 2)}")
        lines.append(f"    the contract's      {_excerpt(want_indices[row], column - 2)}")
        lines.append("  " + self.geometry())
        raise ReplayMismatch(
            "\n".join(lines),
            step=self.harness.steps,
            section=self.section,
            row=row,
            column=column,
            kind=kind,
        )

    def hazard(self, row: int, want_lens: torch.Tensor) -> str:
        seen = self.seen
        width = self.batch.width
        stop = int(sentinel_lengths(seen.indices_seen)[row])
        stale = seen.indices_seen[row, width:stop]
        shown = stale[:8].tolist()
        return (
            f"stale-sentinel hazard at {self.header()}\n"
            f"  {self.token(row)}: lens {int(want_lens[row])}, but no -1 in columns < W={width}; "
            f"a consumer that trusts the -1 sentinel reads on into columns [{width}, {stop}), "
            f"which this step did not write; stale indices there: {shown}"
            + (f" ... ({stale.numel()} in all)" if stale.numel() > 8 else "")
            + "\n  (consumers that stop at decode_lens are unaffected; "
            "this check is opt-in: --c128a-strict-sentinels)"
        )
