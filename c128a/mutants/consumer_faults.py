"""Consumer and launch-key faults: the oracle's builder with one consumer of
its views broken the way a kernel written for full-width, contiguous rows
breaks; a keyed launcher whose warm-up keys ignore a stride; and a builder
that declares a keyed launcher it never launches through."""

from __future__ import annotations

import dataclasses
import types

import torch

from ..contract import oracle
from ..step.consumer_inputs import ORACLE_CONSUMERS, Consumer, ConsumerInputs
from ..step.consumer_inputs import oracle_global_topk, oracle_mixed_sparse
from .registry import Mutant, register


def _replaced(name: str, run) -> tuple[Consumer, ...]:
    return tuple(dataclasses.replace(c, run=run) if c.name == name else c
                 for c in ORACLE_CONSUMERS)


def consumer_mutant(description: str, bug_class: str, consumer: str,
                    killed_by: tuple[str, ...] = ("consumers",)):
    """Register ``_consume_NAME(inputs)`` as mutant ``NAME``: the oracle's
    builder, its consumer ``consumer`` replaced by the faulty one."""

    def add(run):
        name = run.__name__.removeprefix("_consume_")
        target = types.SimpleNamespace(
            build_c128a_topk_metadata=oracle.build_c128a_topk_metadata,
            consumers=_replaced(consumer, run),
        )
        register(Mutant(name, description, bug_class, killed_by, target))
        return run

    return add


def _packed(view: torch.Tensor) -> torch.Tensor:
    """``view``'s rows read at its packed stride (its width), from where it starts."""
    return view.as_strided(tuple(view.shape), (view.shape[1], 1))


@consumer_mutant(
    "a prefill consumer (compute_global_topk_indices_and_lens) reads the prefill view at "
    "its packed stride W, not its row stride C: right at W = C, rows 1 onward wrong below",
    "packed stride",
    "global_topk",
)
def _consume_global_topk_packed_stride(inputs: ConsumerInputs):
    return oracle_global_topk(dataclasses.replace(inputs, prefill_local=_packed(inputs.prefill_local)))


@consumer_mutant(
    "the decode-first index matrix (build_flashinfer_mixed_sparse_indices) counts a decode "
    "row's valid entries (>= 0) instead of reading decode_lens: trusts the -1 sentinel past "
    "the lengths, so a padding token's row of real slot ids is attended, and a row "
    "replayed at the capture-time width reads stale slot ids past W",
    "padding tokens",
    "mixed_sparse",
    ("consumers", "consumers_replay"),
)
def _consume_mixed_sparse_trusts_sentinel(inputs: ConsumerInputs):
    counted = (inputs.global_decode >= 0).sum(dim=1).to(torch.int32)
    return oracle_mixed_sparse(dataclasses.replace(inputs, decode_lens=counted))


__all__ = ["consumer_mutant"]


def _keyed():
    # The kernels' package imports Triton: imported on first use, after the
    # device is chosen.
    from ..kernels import keyed

    return keyed


class KeyedNamespace:
    """A target namespace of :mod:`c128a.kernels.keyed` (it imports Triton),
    read from it on first use, after the device is chosen."""

    def __init__(self, attribute: str):
        self._attribute = attribute

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(getattr(_keyed(), self._attribute), name)

    def __repr__(self) -> str:
        return f"c128a.kernels.keyed:{self._attribute}"


register(Mutant(
    "stride_blind_keys",
    "a builder launched through a keyed launcher (c128a.kernels.keyed) whose kernel "
    "specialises on the row strides, while its warm-up keys take the row stride to be the "
    "width: every launch below W = C compiles during inference",
    "recompilation mid-inference",
    ("compile_keys",),
    KeyedNamespace("stride_blind"),
))


class _DeclaresTheKeyedLauncher:
    """The oracle's builder (plain torch) declaring the keyed kernel's
    launcher as its own: its launches never go through it. The launcher is
    read from the kernels on first use, after the device is chosen."""

    build_c128a_topk_metadata = staticmethod(oracle.build_c128a_topk_metadata)

    def __getattr__(self, name: str):
        if name != "launchers":
            raise AttributeError(name)
        return _keyed().target.launchers

    def __repr__(self) -> str:
        return "c128a.mutants:launcher_never_launched"


register(Mutant(
    "launcher_never_launched",
    "a builder that declares a keyed launcher (c128a.kernels.keyed's) but builds without it, "
    "as a wrapper that calls its kernel directly or falls back to torch on this device does: "
    "no launch of it has a compile key to compare, so none is warmed or checked",
    "recompilation mid-inference",
    ("compile_keys",),
    _DeclaresTheKeyedLauncher(),
))
