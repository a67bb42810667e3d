"""A tiny kernel-like subject for the mutation machinery's tests.

A builder (torch only, the oracle's writes) whose ``decode_lens`` come from
one small "kernel", :func:`write_lengths`, swept over the tokens in chunks
as a kernel's programs sweep them. Its nine mutants (``c128a mutate
--subject mutation_subject:SUBJECT --list``) are each of one kind the
machinery must tell apart, judged by ``matches_oracle`` alone:

- ``compress_ratio != NO_RATIO``: the process aborts (crashed);
- ``numel() >= MAX_TOKENS``: survives (no step has a million tokens);
- ``numel() <= MAX_TOKENS``: every length zeroed (killed);
- ``start = 1``, ``start = -1``, ``start >= numel()``, ``start - CHUNK``:
  tokens left unwritten (killed);
- ``start <= numel()``: one more sweep over no token (equivalent);
- ``start -= CHUNK``: the sweep never ends (timed out).

Children import it by name: the tests put this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import os

import torch

from c128a.contract import contract_builder
from c128a.contract.oracle import attended_lengths, write_metadata
from c128a.contract.validation import check_build_arguments
from c128a.runners.mutation import Run, Subject

MAX_TOKENS = 1 << 20  # module constants are not mutated: only the kernel is
NO_RATIO = 0
CHUNK = 4
UNWRITTEN = -7


def mutable(function):
    """Marks the subject's kernel (what ``triton.jit`` marks in the project's)."""
    return function


@mutable
def write_lengths(lengths, positions, compress_ratio, width):
    if compress_ratio == NO_RATIO:
        os.abort()  # a fault that takes the process down, as a store through a wild pointer can
    start = 0
    while start < positions.numel():
        stop = start + CHUNK
        lengths[start:stop] = attended_lengths(positions[start:stop], compress_ratio, width)
        start += CHUNK
    if positions.numel() > MAX_TOKENS:
        lengths.zero_()


def _build(args):
    check_build_arguments(args)
    views = write_metadata(args)
    decode = args.num_decode_tokens
    lengths = torch.full((decode,), UNWRITTEN, dtype=torch.int64)
    write_lengths(lengths, args.positions[:decode], args.compress_ratio, args.max_compressed_tokens)
    padding = args.slot_mapping[:decode] < 0
    args.decode_lens_buffer[:decode] = torch.where(padding, 0, lengths).to(torch.int32)
    return views


build_c128a_topk_metadata = contract_builder(_build)

SUBJECT = Subject(
    "tiny", "mutation_subject", (Run("tiny", "", ("matches_oracle",)),), decorators=("mutable",)
)


def _held_to_inert(module, spec):
    from c128a.targets import Target, held_to

    return held_to(Target.from_object(spec, module), "inert")


HELD_TO_INERT = Subject(
    "tiny", "mutation_subject", (Run("tiny held to inert", _held_to_inert, ("matches_oracle",)),),
    decorators=("mutable",),
)
"""The same kernel judged as an ``inert`` builder, which it is not: its control fails."""
