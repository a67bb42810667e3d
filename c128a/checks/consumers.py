"""Pipeline checks: a build's views fed to the consumers an engine runs on them,
eagerly and as captured in a CUDA graph.

What a consumer *publishes* is what a downstream attention kernel may read:
per row its length, and the leading columns within that length
(:mod:`c128a.contract.oracle_consumers`). The invariant: every consumer of the
target (the oracle's for a target that names none,
:data:`~c128a.step.consumer_inputs.ORACLE_CONSUMERS`) publishes, fed the
adaptive build's views, what it publishes fed the full-width build's
views, and what the oracle's consumer publishes fed the oracle's views.
"""

from __future__ import annotations


import torch

from ..contract import SLOTS
from ..failures import InvariantViolation, call_target
from ..step import Batch, Buffers, BuildResult, build, oracle_build
from ..step.consumer_inputs import ORACLE_CONSUMERS, PREFILL_TOKENS, Consumer, ConsumerInputs
from .diff import setting, token, window

NAME = "consumers"


def consumers_of(target) -> tuple[Consumer, ...]:
    """The consumers ``target`` names, else the oracle's."""
    return tuple(getattr(target, "consumers", ()) or ()) or ORACLE_CONSUMERS


def oracle_consumer(name: str) -> Consumer:
    return next(c for c in ORACLE_CONSUMERS if c.name == name)


def published(consumer: Consumer, result: BuildResult, invariant: str = NAME):
    """(indices, lens) ``consumer`` publishes fed ``result``'s views, on the
    host; what it raises is a :class:`~c128a.failures.TargetRaised`."""
    inputs = ConsumerInputs.from_build(result)
    indices, lens = call_target(invariant, f"consumer {consumer.name}", consumer, inputs)
    return indices.cpu(), None if lens is None else lens.cpu()


def compare_published(consumer: Consumer, batch: Batch, actual, expected, what: str,
                      invariant: str = NAME, real_tokens_only: bool = False,
                      decode_rows_only: bool = False) -> None:
    """Raise unless ``actual`` publishes what ``expected`` does: the same
    length per row and the same values within it (the whole of
    ``actual``'s rows where there are no lengths); with
    ``real_tokens_only``, rows of padding tokens (slot < 0) are left out,
    with ``decode_rows_only`` the rows of prefill tokens."""
    (indices, lens), (want, want_lens) = actual, expected
    first = batch.num_decode_tokens if consumer.rows == PREFILL_TOKENS else 0
    last = batch.num_decode_tokens if decode_rows_only else batch.num_tokens
    rows = max(last - first, 0)
    head = f"consumer {consumer.name} ({consumer.doc}), {what}"
    for name, tensor in (("indices", indices), ("lengths", lens)):
        if tensor is not None and tensor.shape[0] < rows:
            raise InvariantViolation(invariant, f"{head}: {name} has {tensor.shape[0]} rows for "
                                     f"{rows} tokens; {setting(batch, batch.width)}")
    for row in range(rows):
        if real_tokens_only and batch.slot_mapping[first + row] < 0:
            continue
        where = token(batch, first + row)
        if lens is not None:
            have, need = int(lens[row]), int(want_lens[row])
            if have != need:
                raise InvariantViolation(
                    invariant, f"{head}: {where}: published length {have}, expected {need}; "
                    + setting(batch, batch.width))
            columns = need
        else:
            columns = indices.shape[1]
        got, exp = indices[row, :columns], want[row, :columns]
        if got.shape != exp.shape or not torch.equal(got.to(torch.int64), exp.to(torch.int64)):
            if got.shape != exp.shape:
                detail = f"row has {got.shape[0]} of the {columns} published columns"
            else:
                column = int((got.to(torch.int64) != exp.to(torch.int64)).nonzero()[0])
                detail = (f"column {column}: {int(got[column])}, expected {int(exp[column])}; "
                          f"near it {window(got, column)} vs {window(exp, column)}")
            raise InvariantViolation(
                invariant, f"{head}: {where}: within the published length {columns}, {detail}; "
                + setting(batch, batch.width))


def check_consumers(target, batch: Batch, device) -> None:
    """Invariant: each consumer of the target publishes, fed the adaptive
    build's views, what it publishes fed the full-width build's views (for
    W >= max_seq_len // R, the builder's precondition; rows of real
    tokens), and what the oracle's consumer publishes fed the oracle's
    views at W (every row)."""
    adaptive = build(target, batch, device)
    adaptive_equals_full = batch.width >= batch.max_seq_len // batch.compress_ratio
    full = (build(target, batch, device, width=batch.widest_width) if adaptive_equals_full
            else None)
    expected = oracle_build(batch, "cpu", padding_rows=getattr(target, "padding_rows", SLOTS))
    for consumer in consumers_of(target):
        from_adaptive = published(consumer, adaptive)
        if full is not None:
            # A padding token's stale position may need more than W: its
            # lists are cut at W by design (its output is discarded).
            compare_published(consumer, batch, from_adaptive, published(consumer, full),
                              f"fed the adaptive views (W={batch.width}) against the "
                              f"full-width views (W=C={batch.capacity})",
                              real_tokens_only=True)
        reference = oracle_consumer(consumer.name)
        compare_published(consumer, batch, from_adaptive, published(reference, expected),
                          f"fed the adaptive views against the oracle's consumer fed the "
                          f"oracle's views (W={batch.width})")


REPLAY = "consumers_replay"
STALE_SLOT = 1 << 20
"""What an earlier, wider step left in the columns a narrower one does not
write (a real slot id: not the -1 sentinel)."""


def _capture(consumer: Consumer, inputs: ConsumerInputs):
    """``consumer`` launched on the capture-time ``inputs``, and a function
    that replays that launch as captured and returns what it publishes. A
    consumer with keyed
    launchers replays its recorded kernel launches (their pointers, strides
    and constants, as a CUDA graph holds them); any other is called again
    on the capture-time views, which read the buffers as they are now."""
    what = f"consumer {consumer.name}"
    if not consumer.launchers:
        call_target(REPLAY, what, consumer, inputs)
        return lambda: call_target(REPLAY, what, consumer, inputs)
    # The kernels' package imports Triton: imported here, after the device is chosen.
    from ..kernels import vllm_shims as shims

    with shims.observed_launches() as records:
        outputs = call_target(REPLAY, what, consumer, inputs)

    def replay():
        for record in records:
            if record.grid is not None:
                record.kernel[record.grid](**record.arguments)
        return outputs

    return replay


def check_consumers_replayed(target, batch: Batch, device) -> None:
    """Invariant: a decode consumer captured on the capture build's views
    (W = C, as the engine captures its FULL CUDA graphs) and replayed after
    a build at the step's W, into buffers whose columns [W, C) hold an
    earlier step's slot ids, publishes what the oracle's consumer publishes
    fed the oracle's views at W, in every decode token's row (a graph holds
    decode-only steps). A consumer that trusts the -1 past the lengths
    reads those stale slot ids."""
    buffers = Buffers.for_batch(batch, device)
    capture = build(target, batch, device, width=batch.widest_width, buffers=buffers)
    inputs = ConsumerInputs.from_build(capture)
    replays = [(consumer, _capture(consumer, inputs)) for consumer in consumers_of(target)
               if consumer.name in REPLAYED]
    d = batch.num_decode_tokens
    buffers.global_decode[:d].fill_(STALE_SLOT)  # the earlier step's rows
    build(target, batch, device, buffers=buffers)
    expected = oracle_build(batch, "cpu", padding_rows=getattr(target, "padding_rows", SLOTS))
    for consumer, replay in replays:
        indices, lens = replay()
        actual = (indices.cpu(), None if lens is None else lens.cpu())
        compare_published(consumer, batch, actual, published(oracle_consumer(consumer.name),
                                                             expected, REPLAY),
                          f"captured at W=C={batch.capacity} and replayed after a build at "
                          f"W={batch.width}", REPLAY, decode_rows_only=True)


REPLAYED = ("mixed_sparse",)
"""The consumers an engine captures in its FULL CUDA graphs (decode-only
steps): FlashInfer's decode-first index matrix."""
