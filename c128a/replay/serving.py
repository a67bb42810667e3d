"""A Hypothesis state machine of the serving loop, replayed through captured consumers.

Each rule changes the scheduler's state and then runs one engine step: every
live request takes part (prefilling requests with their next chunk, decoding
requests with one query token, or 1..8 for the request a rule advances), the
step is padded to a capture size, built into the persistent buffers through
:func:`c128a.checks.check_step` (every one-build invariant), and the
captured consumers of :class:`c128a.replay.ReplayHarness` are replayed and
checked against the oracle consumer. A shrunk failure prints as the list of
rule calls, e.g. ``requests_0 = state.add_request(cached=16383, prompt=1,
chunk=1)`` then ``state.advance(request=requests_0, tokens=2)``, followed by
each step's batch (``note``) and the failing check's diff.

Rules: add a request (a prefix-cache hit of ``cached`` tokens, then ``prompt``
new tokens prefilled ``chunk`` at a time); advance a request by 1..8 accepted
tokens; finish a request (its pages return to the pool); reallocate a
request's pages (preemption and recompute: same positions, new block-table
entries, reused pages first); jump a request to another context length, so
that W crosses powers of two up and down; run a step right after another
layer's step of another shape used the same buffers (``batch.prior``: other
decode and prefill rows up to the buffers' rows, another R and B, its
buffers swapped, from a row offset or at the same addresses with another
row stride and width, at another width), which
:meth:`c128a.replay.ReplayHarness.run_step` builds first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import hypothesis.strategies as st
import torch
import hypothesis
from hypothesis import event, note
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, precondition, rule

from ..checks import check_step
from ..checks.prior_shape import describe
from ..checks.compile_keys import check_compile_keys
from ..contract import (
    COMPRESS_RATIO,
    MAX_QUERY_TOKENS_PER_DECODE,
    PAGE_TOKENS,
    target_capacity,
    target_reachable_widths,
    target_width,
)
from ..strategies.reach import BY_NAME, SHAPE_HISTORY, WIDTH_HISTORY
from ..strategies.shape_history import OTHER_BLOCK_SIZES, OTHER_RATIOS, ROW_BLOCK
from ..failures import ContractViolation, HarnessError
from ..step import Batch, PriorStep, StepRequest, assemble_batch
from .harness import ReplayHarness
from .recorded import MachineStep, MachineSteps, attach_steps, recorded_width

DEFAULT_MAX_MODEL_LEN = {
    "cuda": 1_048_576,  # capacity 8192: every width 128 ... 8192 is reachable
    "cpu": 262_144,  # capacity 2048: widths 128 ... 2048, cheap under Triton's interpreter
}
MAX_REQUESTS = 4
MAX_QUERY_TOKENS = MAX_QUERY_TOKENS_PER_DECODE  # one token plus up to 7 accepted drafts
CAPTURE_LIMIT = 16  # decode: MAX_QUERY_TOKENS + (MAX_REQUESTS - 1); prefill: MAX_REQUESTS * 4
TABLE_PADDING = -7  # block-table entries past a request's pages (never read)
ACROSS_A_BLOCK_ROWS = ROW_BLOCK + 8
"""Engine buffer rows (``build_machine(buffer_rows=...)``) with which
another layer's step may fill more than one 64-row block. Every step
checks and copies the whole buffers, so a step costs about that much
more: the default is the CAPTURE_LIMIT rows the loop's own steps fill."""
MAX_OTHER_LAYER_STEPS = 2
"""Steps after another layer's in one run: each builds that layer's step
too (up to twice the buffers' rows in tokens)."""


WIDTH_HISTORY_DIMENSION = BY_NAME[WIDTH_HISTORY]


def contexts(max_model_len: int) -> st.SearchStrategy[int]:
    """Context lengths in tokens, spread over every width the policy can pick.

    Draws an exponent k, then a length whose lists need about 2**k entries,
    often exactly the band's top (R * 2**k - 1: the next token's n(t) is then
    exactly 2**k, a full row at W = 2**k). Capped below ``max_model_len``
    leaving room for later tokens. Shrinks towards k = 0, length 0.
    """
    ratio = COMPRESS_RATIO
    cap = max_model_len - 1024
    top = max(cap // ratio, 1).bit_length()

    def band(k: int) -> st.SearchStrategy[int]:
        low = 0 if k == 0 else ratio * 2 ** (k - 1)
        high = ratio * 2**k - 1
        return st.one_of(st.integers(low, high), st.just(high)).map(lambda c: min(c, cap))

    return st.integers(0, top).flatmap(band)


@dataclass(eq=False)
class Request:
    """One request as the scheduler sees it."""

    number: int
    length: int  # tokens in the KV cache: the next token's position
    prompt_left: int  # prompt tokens still to prefill
    chunk: int
    pages: list[int] = field(default_factory=list)
    finished: bool = False

    @property
    def decoding(self) -> bool:
        return self.prompt_left == 0

    def __repr__(self) -> str:
        phase = "decoding" if self.decoding else f"prefilling, {self.prompt_left} left"
        return f"Request(r{self.number}: length {self.length}, {phase})"


class PagePool:
    """KV pages; freed pages are reused first (LIFO), so block tables change."""

    def __init__(self, num_pages: int):
        self.free = list(range(num_pages - 1, -1, -1))
        self.reused = 0
        self._ever_used: set[int] = set()

    def take(self, count: int) -> list[int]:
        if count > len(self.free):
            raise HarnessError(
                f"page pool exhausted: {count} pages asked for, {len(self.free)} free; "
                "raise the pool size"
            )
        pages = [self.free.pop() for _ in range(count)]
        self.reused += sum(1 for page in pages if page in self._ever_used)
        self._ever_used.update(pages)
        return pages

    def give_back(self, pages: list[int]) -> None:
        self.free.extend(reversed(pages))


def serving_loop_machine(target, device, *, strict_sentinels: bool = False):
    """The serving-loop state machine for ``target`` on ``device``.

    Run it with ``hypothesis.stateful.run_state_machine_as_test(machine,
    settings=...)`` or expose ``machine.TestCase`` to pytest. With
    ``strict_sentinels`` the opt-in stale-sentinel check raises
    :class:`~c128a.failures.StaleSentinelHazard` when it trips. Up to
    :data:`MAX_OTHER_LAYER_STEPS` steps a run follow another layer's step
    of another shape.
    """
    return build_machine(target, device, strict_sentinels=strict_sentinels,
                         other_layer_steps=MAX_OTHER_LAYER_STEPS)


def build_machine(
    target,
    device,
    *,
    strict_sentinels: bool = False,
    check_invariants: bool = True,
    check_window: bool = True,
    max_model_len: int | None = None,
    on_step=None,
    on_reach=None,
    buffer_rows: int = CAPTURE_LIMIT,
    other_layer_steps: int = 0,
):
    """:func:`serving_loop_machine` with knobs for the suite's own tests:
    ``check_invariants=False`` builds without :func:`c128a.checks.check_step`
    and ``check_window=False`` skips the index-window comparison, so that a
    test can show which replay check catches a fault on its own;
    ``on_step(batch, description)``, where given, sees each step before it
    is built (the compile-key check, :mod:`c128a.checks.compile_keys`);
    ``on_reach(labels)``, where given, sees the reach labels each step
    reports with ``event()`` (:mod:`c128a.strategies.reach`);
    ``other_layer_steps`` is how many steps a run may take right after
    another layer's step of another shape (none: the machine has no such
    rule, and draws as it did before it had one), and ``buffer_rows`` sizes
    the engine's buffers, which that layer's step fills up to
    (:data:`ACROSS_A_BLOCK_ROWS` and more: past a 64-row block).
    ``max_model_len`` defaults by device (:data:`DEFAULT_MAX_MODEL_LEN`).

    The engine is captured once per machine class; each run starts from the
    state right after capture (:meth:`c128a.replay.ReplayHarness.reset`).
    A failing example's exception carries the steps it built, none for a
    failure at capture (:func:`c128a.replay.recorded.machine_steps_of`), and the class's
    ``replay_recorded(steps)`` runs such a record again without Hypothesis.
    """
    device = torch.device(device)
    if max_model_len is None:
        max_model_len = DEFAULT_MAX_MODEL_LEN[device.type]
    setup = ServingSetup(
        target, device, max_model_len=max_model_len,
        buffer_rows=buffer_rows, max_other_layer_steps=other_layer_steps,
        check_invariants=check_invariants, check_window=check_window,
        strict_sentinels=strict_sentinels, on_step=on_step, on_reach=on_reach,
    )
    # Named ServingLoop, a name no class in this file's source has: Hypothesis
    # then keys the machine's example database and derandomized draws on the
    # name alone, so they do not change with an edit of the rules.
    namespace = {"setup": setup, "replay_recorded": staticmethod(setup.replay_recorded),
                 **_sized_rules(setup)}
    return type("ServingLoop", (ServingLoopRules,), namespace)


@dataclass(eq=False)
class ServingSetup:
    """What one machine class runs on: its target and device, the engine's
    size, its checks and the suite's hooks (:func:`build_machine`'s knobs),
    and the engine itself, captured on the class's first run and reset for
    each later one."""

    target: Any
    device: torch.device
    max_model_len: int
    buffer_rows: int = CAPTURE_LIMIT
    max_other_layer_steps: int = 0
    check_invariants: bool = True
    check_window: bool = True
    strict_sentinels: bool = False
    on_step: Callable | None = None
    on_reach: Callable | None = None
    captured: ReplayHarness | None = field(default=None, init=False)

    @property
    def block_size(self) -> int:
        return PAGE_TOKENS // COMPRESS_RATIO

    @property
    def num_pages(self) -> int:
        pages_per_request = -(-self.max_model_len // PAGE_TOKENS) + 2 * MAX_QUERY_TOKENS
        # One request's worth spare: reallocation takes new pages before freeing the old.
        return (MAX_REQUESTS + 1) * pages_per_request

    def new_engine(self, model_len: int, kv_slots: int, capture_limit: int,
                   table_block_size: int) -> ReplayHarness:
        return ReplayHarness(
            self.target,
            self.device,
            max_model_len=model_len,
            kv_slots=kv_slots,
            capture_limit=capture_limit,
            buffer_rows=self.buffer_rows,
            block_size=table_block_size,
            build_step=self._checked_build if self.check_invariants else None,
            strict_sentinels=self.strict_sentinels,
            check_window=self.check_window,
        )

    def _checked_build(self, batch, buffers, before):
        return check_step(self.target, batch, self.device, buffers=buffers, before=before)

    def started(self) -> ReplayHarness:
        """The engine at the state right after capture: captured on the
        first run, reset for each later one."""
        if self.captured is None:
            self.captured = self.new_engine(self.max_model_len, self.num_pages * self.block_size,
                                            CAPTURE_LIMIT, self.block_size)
        else:
            self.captured.reset()
        return self.captured

    def capture_record(self) -> MachineSteps:
        """The engine with no step: the record of a failure at capture. The
        width it captures at, where the target's policy gives a valid one."""
        try:
            capacity = target_capacity(self.target, self.max_model_len, COMPRESS_RATIO)
            capture_width = target_width(self.target, self.max_model_len, COMPRESS_RATIO,
                                         capacity)
        except Exception:  # noqa: BLE001 - the policy's own failure is the one recorded
            capture_width = None
        return MachineSteps(
            max_model_len=self.max_model_len, capture_width=recorded_width(capture_width),
            capture_limit=CAPTURE_LIMIT, kv_slots=self.num_pages * self.block_size,
            block_size=self.block_size,
        )

    def replay_recorded(self, recorded: MachineSteps) -> ReplayHarness:
        """Run ``recorded``'s steps in order on a fresh engine of its
        recorded size, captured at this target's width, with this machine's
        checks; each step built at the width this target's policy chooses
        for it. Whatever a check raises passes through. No Hypothesis."""
        harness = self.new_engine(recorded.max_model_len, recorded.kv_slots,
                                  recorded.capture_limit, recorded.block_size)
        for step in recorded.steps:
            batch = dataclasses.replace(
                step.batch, capacity=harness.capacity, buffer_rows=harness.rows,
                width=target_width(self.target, step.batch.max_seq_len, COMPRESS_RATIO,
                                   harness.capacity),
            )
            if self.on_step is not None:
                self.on_step(batch, step.description)
            harness.run_step(batch)
        return harness


class ServingLoopRules(RuleBasedStateMachine):
    """The serving loop's rules and its engine step. Runnable as the
    subclass :func:`build_machine` makes for one target (``setup``: its
    engine and knobs), which also gives the rules whose draws depend on the
    engine's size (:func:`_sized_rules`)."""

    requests = Bundle("requests")
    setup: ClassVar[ServingSetup]

    def __init__(self):
        super().__init__()
        try:
            self.harness = self.setup.started()
        except Exception as exc:
            # A failure at capture: its record is the engine alone, which
            # replay_recorded captures again (no Hypothesis needed).
            attach_steps(exc, self.setup.capture_record())
            raise
        self.pool = PagePool(self.setup.num_pages)
        self.live: list[Request] = []
        self.admitted = 0
        self.last_width: int | None = None
        self.last_built: PriorStep | None = None  # the shape of the last build
        self.other_layer_steps = 0
        self.width_changes = 0
        self.largest_drop = 0
        self.built: list[MachineStep] = []  # this example's steps, for its failure

    # Rules --------------------------------------------------------------

    def add_request(self, cached, prompt, chunk):  # a rule of build_machine's class
        request = Request(self.admitted, cached, prompt, chunk)
        self.admitted += 1
        self._cover(request, cached)
        self.live.append(request)
        self._step(f"add_request r{request.number}")
        return request

    @rule(request=requests, tokens=st.integers(1, MAX_QUERY_TOKENS))
    def advance(self, request, tokens):
        if not request.decoding:
            event("advance: request still prefilling, takes its chunk")
        elif tokens > 1:
            event("advance: speculative tokens accepted")
        self._step(f"advance r{request.number} by {tokens}", {request.number: tokens})

    @rule(request=consumes(requests))
    def finish(self, request):
        request.finished = True
        self.live.remove(request)
        self.pool.give_back(request.pages)
        request.pages = []
        self._step(f"finish r{request.number}")

    @rule(request=requests)
    def reallocate_pages(self, request):
        old = request.pages
        request.pages = []
        self._cover(request, request.length)
        self.pool.give_back(old)
        self._step(f"reallocate_pages r{request.number}")

    def jump(self, request, context):  # a rule of build_machine's class
        event("jump: longer context" if context > request.length else "jump: shorter context")
        request.length = context
        keep = -(-context // PAGE_TOKENS)
        if len(request.pages) > keep:
            self.pool.give_back(request.pages[keep:])
            del request.pages[keep:]
        self._cover(request, context)
        self._step(f"jump r{request.number} to {context}")

    def step_after_another_layer(self, decode, prefill, geometry, placement, width, pick):
        """One step right after another layer's step through the same
        buffers: other rows, R and B, placement and width (a rule of
        build_machine's class where it asks for such steps)."""
        self.other_layer_steps += 1
        ratio = COMPRESS_RATIO
        if geometry in ("ratio", "both"):
            others = [r for r in OTHER_RATIOS if r != ratio]
            ratio = others[pick % len(others)]
        block = self.setup.block_size
        if geometry in ("block", "both"):
            others = [b for b in OTHER_BLOCK_SIZES if b != block]
            block = others[(pick >> 4) % len(others)]
        rows = self.setup.buffer_rows
        offset = 0
        if placement == "row offset":
            offset = 1 + pick % max(rows - max(decode, prefill), 1)
        offset = min(offset, rows - max(decode, prefill))
        widths = target_reachable_widths(self.harness.target, self.harness.capacity)
        columns = 0
        if pick >> 12 & 1 and self.harness.capacity >= 256:
            # Another capacity's buffers at the same addresses: half the
            # columns, so twice the rows fit (a freed workspace reused).
            # From a bit of ``pick`` no other choice reads: no new draw.
            columns = self.harness.capacity // 2 // 128 * 128
            widths = [w for w in widths if w <= columns]
        prior = PriorStep(decode, prefill, ratio, block, swapped=placement == "swapped",
                          row_offset=offset, columns=columns)
        self._step(f"after another layer: {describe(prior)}", prior=prior,
                   prior_width=widths[width % len(widths)])

    def teardown(self):
        hypothesis.target(float(self.width_changes), label="width changes")
        hypothesis.target(float(self.largest_drop), label="largest width drop (log2)")

    # One engine step ---------------------------------------------------

    def _cover(self, request: Request, tokens: int) -> None:
        """Give ``request`` pages for its first ``tokens`` tokens."""
        needed = -(-tokens // PAGE_TOKENS) - len(request.pages)
        if needed > 0:
            request.pages.extend(self.pool.take(needed))

    def _step(self, cause: str, speculative: dict[int, int] | None = None, *,
              prior: PriorStep | None = None, prior_width: int = 0) -> None:
        speculative = speculative or {}
        decode, prefill = [], []  # (request, query tokens)
        for request in self.live:
            room = self.setup.max_model_len - request.length
            if request.decoding:
                count = min(speculative.get(request.number, 1), room)
                decode.append((request, count))
            else:
                prefill.append((request, min(request.chunk, request.prompt_left, room)))
        decode = [(r, n) for r, n in decode if n > 0]
        prefill = [(r, n) for r, n in prefill if n > 0]
        if not decode and not prefill:
            event("idle step: no tokens scheduled")
            note(f"[{cause}] no tokens to schedule")
            return
        for request, count in decode + prefill:
            self._cover(request, request.length + count)

        batch = self.harness.pad(self._batch(decode, prefill))
        if prior is not None:
            batch = dataclasses.replace(batch, prior=prior, prior_width=prior_width)
        description = f"[{cause}] " + self._describe(batch, decode, prefill)
        note(description)
        self.built.append(MachineStep(description, batch))
        try:
            if self.setup.on_step is not None:
                self.setup.on_step(batch, description)
            outcome = self.harness.run_step(batch)
            self._observe_shape(batch)  # against the last build: before _observe moves on
        except Exception as exc:
            # The failure carries the steps that led to it: a case
            # replays them without the blob (c128a.cases).
            attach_steps(exc, self._recorded())
            raise
        self._observe(outcome)

        for request, count in decode:
            request.length += count
        for request, count in prefill:
            request.length += count
            request.prompt_left -= count

    def _recorded(self) -> MachineSteps:
        harness = self.harness
        return MachineSteps(
            max_model_len=harness.max_model_len,
            capture_width=recorded_width(harness.capture_width),
            capture_limit=harness.sizes[-1], kv_slots=harness.kv.numel(),
            block_size=harness.block_size, steps=tuple(self.built),
        )

    def _batch(self, decode, prefill) -> Batch:
        def scheduled(request, count) -> StepRequest:
            positions = tuple(range(request.length, request.length + count))
            return StepRequest(positions, tuple(self._slot(request, p) for p in positions))

        table_width = max((len(r.pages) for r, _ in decode), default=0)
        table = tuple(
            tuple(r.pages) + (TABLE_PADDING,) * (table_width - len(r.pages)) for r, _ in decode
        )
        requests = [scheduled(r, n) for r, n in decode + prefill]
        max_seq_len = max(r.seq_len for r in requests)
        capacity = self.harness.capacity
        return assemble_batch(
            requests[: len(decode)],
            requests[len(decode) :],
            block_table=table,
            max_model_len=self.setup.max_model_len,
            capacity=capacity,
            width=target_width(self.setup.target, max_seq_len, COMPRESS_RATIO, capacity),
            buffer_rows=self.harness.rows,
            block_size=self.setup.block_size,
            labels=("serving-loop step",),
        )

    @staticmethod
    def _slot(request: Request, position: int) -> int:
        return request.pages[position // PAGE_TOKENS] * PAGE_TOKENS + position % PAGE_TOKENS

    def _describe(self, batch: Batch, decode, prefill) -> str:
        parts = [f"r{r.number} decode {r.length}..{r.length + n - 1}" for r, n in decode]
        parts += [f"r{r.number} prefill {r.length}..{r.length + n - 1}" for r, n in prefill]
        padding = sum(1 for s in batch.slot_mapping if s < 0)
        return (
            f"step {self.harness.steps + 1}: W={batch.width} (capture W="
            f"{self.harness.capture_width}); " + ", ".join(parts)
            + (f"; {padding} padding token(s)" if padding else "")
        )

    def _report(self, label: str) -> None:
        event(label)
        if self.setup.on_reach is not None:
            self.setup.on_reach([label])

    def _observe_shape(self, batch: Batch) -> None:
        """The reach's history (c128a.strategies.reach): this step against
        the step built before it into the same buffers (another layer's,
        or the loop's own last step)."""
        earlier_width = batch.earlier_width if batch.prior is not None else self.last_width
        if earlier_width is not None:
            self._report(WIDTH_HISTORY_DIMENSION.label(
                "same W" if batch.width == earlier_width
                else "wider than the last build" if batch.width > earlier_width
                else "narrower than the last build"))
        if batch.prior is None and self.last_built is not None:
            batch = dataclasses.replace(batch, prior=self.last_built)
        if batch.prior is not None:
            for dimension in SHAPE_HISTORY:
                bucket = dimension.bucket_of(batch)
                if bucket is not None:
                    self._report(dimension.label(bucket))
        self.last_built = PriorStep(batch.num_decode_tokens, batch.num_prefill_tokens,
                                    batch.compress_ratio, batch.block_size)

    def _observe(self, outcome) -> None:
        width = outcome.width
        event(f"W={width}")
        if self.last_width is not None and width != self.last_width:
            self.width_changes += 1
            if width < self.last_width:
                drop = self.last_width.bit_length() - width.bit_length()
                self.largest_drop = max(self.largest_drop, drop)
        self.last_width = width
        if width < self.harness.capture_width:
            event("W < W_capture: stale columns visible to the captured consumer")
        for hazard in outcome.hazards:
            event("stale-sentinel hazard (reported with --c128a-strict-sentinels)")
            note(hazard)
        if self.pool.reused:
            event("pages reused")



def _sized_rules(setup: ServingSetup) -> dict[str, Any]:
    """The rules whose draws depend on ``setup``'s engine: context lengths
    below its max_model_len, another layer's rows up to its buffers'. A
    step after another layer's is a rule only where asked for: another rule
    changes how every run is drawn and shrunk, even where its precondition
    fails."""
    requests = ServingLoopRules.requests
    rules = {
        "add_request": precondition(lambda self: len(self.live) < MAX_REQUESTS)(rule(
            target=requests,
            cached=contexts(setup.max_model_len),
            prompt=st.integers(1, 8),
            chunk=st.integers(1, 4),
        )(ServingLoopRules.add_request)),
        "jump": rule(
            request=requests, context=contexts(setup.max_model_len),
        )(ServingLoopRules.jump),
    }
    if setup.max_other_layer_steps:
        rules["step_after_another_layer"] = precondition(
            lambda self: self.other_layer_steps < setup.max_other_layer_steps
        )(rule(
            decode=st.integers(0, setup.buffer_rows),
            prefill=st.integers(0, setup.buffer_rows),
            geometry=st.sampled_from(("same", "ratio", "block", "both")),
            placement=st.sampled_from(("same", "swapped", "row offset")),
            width=st.integers(0, 1 << 16),
            pick=st.integers(0, 1 << 16),
        )(ServingLoopRules.step_after_another_layer))
    return rules


COMPILE_KEYS_SETTINGS = hypothesis.settings(
    max_examples=3, stateful_step_count=12, deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck), database=None)
"""A few serving loops of a dozen steps: the check compiles and runs nothing."""
COMPILE_KEYS_MODEL_LEN = 81_920
"""The engine's max_model_len for :func:`compile_keys_machine`: C = 640 at
R = 128, so the serving loop's widths 128 to 640 all differ from C."""


def compile_keys_machine(target, device, saved: list | None = None):
    """The serving-loop machine checking only compile keys: every step's
    launches through ``target``'s keyed launchers must take keys their
    warm-up compiles (:func:`c128a.checks.compile_keys.check_compile_keys`);
    a miss is appended to ``saved`` (the step and the message) where given."""
    def on_step(batch, description):
        try:
            check_compile_keys(target, batch, device, step=description)
        except ContractViolation as exc:
            if saved is not None:
                saved.append((batch, str(exc)))
            raise

    return build_machine(target, device, check_invariants=False, check_window=False,
                         max_model_len=COMPILE_KEYS_MODEL_LEN, on_step=on_step)
