"""Bad input: every argument outside the contract (or the project's own
checks) is refused with a ``ValueError`` naming it, and nothing is written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import phases
from ..contract import BuildArgs
from ..contract.call import BUFFER_ARGUMENTS
from ..failures import InvariantViolation
from ..step import Batch, Buffers
from ..step.inputs import check_inputs_unchanged
from ..targets import is_project_target
from .diff import all_equal, first_difference, setting


@dataclass(frozen=True)
class BadInput:
    """One way to break the builder's arguments.

    ``mutate(args, batch)`` returns changed :class:`~c128a.contract.BuildArgs`;
    ``argument`` must appear in the ValueError's message. ``contract`` marks
    the contract's own preconditions, which every validating target checks;
    the others are the project's extra checks. ``needs`` says what the batch must have for
    the case to apply: "", "tokens", "two tokens", "decode", "decode entries"
    or "two buffer rows".
    """

    name: str
    argument: str
    contract: bool
    mutate: Callable[[BuildArgs, Batch], BuildArgs]
    needs: str = ""

    def applies(self, batch: Batch) -> bool:
        if self.needs == "tokens":
            return batch.num_tokens > 0
        if self.needs == "decode":
            return batch.num_decode_tokens > 0
        if self.needs == "decode entries":
            return _table_columns_needed(batch) > 0
        if self.needs == "two tokens":
            return batch.num_tokens >= 2
        if self.needs == "two buffer rows":
            return batch.buffer_rows >= 2
        return True


def _table_columns_needed(batch: Batch) -> int:
    """Block-table columns the batch's real decode tokens read at its width
    (padding tokens' rows read none under the ``inert`` variant, so a
    table cut below this is too narrow under both)."""
    decode = range(batch.num_decode_tokens)
    entries = [
        min((batch.positions[t] + 1) // batch.compress_ratio, batch.width)
        for t in decode
        if batch.slot_mapping[t] >= 0
    ]
    return max((-(-n // batch.block_size) for n in entries), default=0)


def _with(args: BuildArgs, **changes) -> BuildArgs:
    return args._replace(**changes)


def _every_other(vector: torch.Tensor) -> torch.Tensor:
    """The same values at stride 2: a view the kernels must not index densely."""
    return vector.repeat_interleave(2)[::2]


def _strided(buffer: torch.Tensor) -> torch.Tensor:
    wide = torch.full(
        (buffer.shape[0], buffer.shape[1] * 2), -99, dtype=buffer.dtype, device=buffer.device
    )
    return wide[:, ::2]


BAD_INPUTS: tuple[BadInput, ...] = (
    BadInput(
        "width_not_multiple_of_128",
        "max_compressed_tokens",
        True,
        lambda a, b: _with(a, max_compressed_tokens=a.max_compressed_tokens - 64),
    ),
    BadInput(
        "width_zero", "max_compressed_tokens", True, lambda a, b: _with(a, max_compressed_tokens=0)
    ),
    BadInput(
        "width_negative",
        "max_compressed_tokens",
        True,
        lambda a, b: _with(a, max_compressed_tokens=-128),
    ),
    BadInput(
        "width_wider_than_buffers",
        "max_compressed_tokens",
        True,
        lambda a, b: _with(a, max_compressed_tokens=a.global_decode_buffer.shape[1] + 128),
    ),
    BadInput(
        "width_wider_than_prefill_buffer",
        "prefill_buffer",
        True,
        lambda a, b: _with(
            a,
            max_compressed_tokens=a.global_decode_buffer.shape[1],
            prefill_buffer=a.prefill_buffer[:, : a.global_decode_buffer.shape[1] - 128],
        ),
    ),
    BadInput(
        "decode_buffer_last_stride_not_1",
        "global_decode_buffer",
        True,
        lambda a, b: _with(a, global_decode_buffer=_strided(a.global_decode_buffer)),
    ),
    BadInput(
        "prefill_buffer_last_stride_not_1",
        "prefill_buffer",
        True,
        lambda a, b: _with(a, prefill_buffer=_strided(a.prefill_buffer)),
    ),
    BadInput(
        "positions_not_dense",
        "positions",
        False,
        lambda a, b: _with(a, positions=_every_other(a.positions)),
        needs="two tokens",
    ),
    BadInput(
        "token_to_req_indices_not_dense",
        "token_to_req_indices",
        False,
        lambda a, b: _with(a, token_to_req_indices=_every_other(a.token_to_req_indices)),
        needs="two tokens",
    ),
    BadInput(
        "slot_mapping_not_dense",
        "slot_mapping",
        False,
        lambda a, b: _with(a, slot_mapping=_every_other(a.slot_mapping)),
        needs="two tokens",
    ),
    BadInput(
        "decode_lens_buffer_not_dense",
        "decode_lens_buffer",
        False,
        lambda a, b: _with(a, decode_lens_buffer=_every_other(a.decode_lens_buffer)),
        needs="two buffer rows",
    ),
    BadInput(
        "position_negative",
        "positions",
        False,
        lambda a, b: _with(a, positions=torch.cat([a.positions[:-1], a.positions[-1:] * 0 - 5])),
        needs="tokens",
    ),
    BadInput(
        "token_to_req_indices_shorter_than_T",
        "token_to_req_indices",
        False,
        lambda a, b: _with(a, token_to_req_indices=a.token_to_req_indices[: b.num_tokens - 1]),
        needs="tokens",
    ),
    BadInput(
        "request_index_negative",
        "token_to_req_indices",
        False,
        lambda a, b: _with(
            a,
            token_to_req_indices=torch.cat(
                [a.token_to_req_indices[:1] * 0 - 1, a.token_to_req_indices[1:]]
            ),
        ),
        needs="decode",
    ),
    BadInput("compress_ratio_zero", "compress_ratio", False, lambda a, b: _with(a, compress_ratio=0)),
    BadInput("block_size_zero", "block_size", False, lambda a, b: _with(a, block_size=0)),
    BadInput(
        "width_not_an_int",
        "max_compressed_tokens",
        False,
        lambda a, b: _with(a, max_compressed_tokens=float(a.max_compressed_tokens)),
    ),
    BadInput(
        "positions_wrong_dtype",
        "positions",
        False,
        lambda a, b: _with(a, positions=a.positions.to(torch.int32)),
    ),
    BadInput(
        "token_to_req_indices_wrong_dtype",
        "token_to_req_indices",
        False,
        lambda a, b: _with(a, token_to_req_indices=a.token_to_req_indices.to(torch.int64)),
    ),
    BadInput(
        "block_table_wrong_dtype",
        "block_table",
        False,
        lambda a, b: _with(a, block_table=a.block_table.to(torch.int64)),
    ),
    BadInput(
        "slot_mapping_wrong_dtype",
        "slot_mapping",
        False,
        lambda a, b: _with(a, slot_mapping=a.slot_mapping.to(torch.int32)),
    ),
    BadInput(
        "decode_buffer_wrong_dtype",
        "global_decode_buffer",
        False,
        lambda a, b: _with(
            a,
            global_decode_buffer=torch.full_like(
                a.global_decode_buffer, -99, dtype=torch.int64
            ),
        ),
    ),
    BadInput(
        "decode_lens_buffer_wrong_dtype",
        "decode_lens_buffer",
        False,
        lambda a, b: _with(
            a, decode_lens_buffer=torch.full_like(a.decode_lens_buffer, -99, dtype=torch.int64)
        ),
    ),
    BadInput(
        "decode_lens_buffer_wrong_device",
        "decode_lens_buffer",
        False,
        lambda a, b: _with(a, decode_lens_buffer=a.decode_lens_buffer.to("meta")),
    ),
    BadInput(
        "prefill_buffer_wrong_device",
        "prefill_buffer",
        False,
        lambda a, b: _with(a, prefill_buffer=a.prefill_buffer.to("meta")),
    ),
    BadInput(
        "num_decode_tokens_above_T",
        "num_decode_tokens",
        False,
        lambda a, b: _with(a, num_decode_tokens=b.num_tokens + 1),
    ),
    BadInput(
        "num_decode_tokens_negative",
        "num_decode_tokens",
        False,
        lambda a, b: _with(a, num_decode_tokens=-1),
    ),
    BadInput(
        "slot_mapping_shorter_than_T",
        "slot_mapping",
        False,
        lambda a, b: _with(a, slot_mapping=a.slot_mapping[: b.num_tokens - 1]),
        needs="tokens",
    ),
    BadInput(
        "block_table_too_few_rows",
        "block_table",
        False,
        lambda a, b: _with(
            a, block_table=a.block_table[: max(b.token_to_req_indices[: b.num_decode_tokens])]
        ),
        needs="decode",
    ),
    BadInput(
        "block_table_too_few_columns",
        "block_table",
        False,
        lambda a, b: _with(a, block_table=a.block_table[:, : _table_columns_needed(b) - 1]),
        needs="decode entries",
    ),
)
"""Every bad input of the builder's contract and of the project's checks."""


def applicable_bad_inputs(target) -> tuple[BadInput, ...]:
    """The cases a target must reject: all for the project's targets, the
    contract's preconditions for any other validating target, none when the
    target declares ``validates_input=False``."""
    if not getattr(target, "validates_input", True):
        return ()
    return tuple(case for case in BAD_INPUTS if case.contract or is_project_target(target))


def check_rejects_bad_input(target, batch: Batch, device, cases=None) -> None:
    """Invariant: each bad variant of ``batch``'s arguments raises a ValueError
    that names the argument, and leaves every buffer and input as it was."""
    cases = applicable_bad_inputs(target) if cases is None else cases
    cases = [case for case in cases if case.applies(batch)]
    if not cases:
        return
    # One set of buffers for every case: a rejected call writes nothing. The
    # buffers are compared once, after the last case (one read-back); only
    # when something changed are the cases run again one at a time, each
    # compared, to name the first that writes.
    buffers = Buffers.for_batch(batch, device)
    snapshot = buffers.clone()
    tensors = batch.tensors(device)
    arguments = batch.build_args(tensors, buffers)
    pairs = _run_cases(target, batch, cases, arguments, buffers, snapshot)
    unchanged = all_equal(pairs)
    if all(unchanged):
        # Nor any input: a refused call writes nothing (inputs_unchanged's diff).
        check_inputs_unchanged(tensors.memory, "after every bad-input case was refused")
        return
    buffer, before = next(pair for pair, same in zip(pairs, unchanged) if not same)
    index = first_difference(buffer, before)  # as it was after the last case
    change = f"element {list(index)} changed from {int(before[index])} to {int(buffer[index])}"
    buffers.copy_(snapshot)
    _run_cases(target, batch, cases, arguments, buffers, snapshot, compare_each=True)
    raise InvariantViolation(
        "rejects_bad_input",
        f"a bad-input case wrote a buffer ({change}), but none did when the {len(cases)} "
        "cases ran again one at a time: the write is not reproducible",
    )


def _run_cases(target, batch: Batch, cases, arguments: BuildArgs, buffers: Buffers,
               snapshot: Buffers, compare_each: bool = False) -> list:
    """Call the target with each case's arguments; raise for a case it does
    not refuse with a ValueError naming the argument. Returns the (buffer,
    snapshot) pairs to compare: the shared buffers and every substitute
    buffer a case passed. With ``compare_each``, each case's pairs are
    compared right after it and the first change raises."""
    pairs = list(zip(buffers.as_tuple(), snapshot.as_tuple()))
    for case in cases:
        args = case.mutate(arguments, batch)
        substitutes = [
            getattr(args, key)
            for key, own in zip(BUFFER_ARGUMENTS, buffers.as_tuple())
            if getattr(args, key) is not own and getattr(args, key).device.type != "meta"
        ]
        case_pairs = [(b, b.clone()) for b in substitutes]
        try:
            with phases.phase("target"):
                target.build_c128a_topk_metadata(*args)
        except ValueError as exc:
            if case.argument not in str(exc):
                raise InvariantViolation(
                    "rejects_bad_input",
                    f"{case.name}: the ValueError does not name {case.argument!r}: {exc}",
                ) from exc
        except Exception as exc:
            raise InvariantViolation(
                "rejects_bad_input",
                f"{case.name}: raised {type(exc).__name__} (not a ValueError naming "
                f"{case.argument!r}): {exc}",
            ) from exc
        else:
            raise InvariantViolation(
                "rejects_bad_input",
                f"{case.name}: accepted {case.argument} without raising ValueError; "
                + setting(batch, batch.width),
            )
        pairs += case_pairs
        if not compare_each:
            continue
        for buffer, before in [*zip(buffers.as_tuple(), snapshot.as_tuple()), *case_pairs]:
            if not torch.equal(buffer, before):
                index = first_difference(buffer, before)
                raise InvariantViolation(
                    "rejects_bad_input",
                    f"{case.name}: raised, but first wrote a buffer: element {list(index)} "
                    f"changed from {int(before[index])} to {int(buffer[index])}",
                )
    return pairs
