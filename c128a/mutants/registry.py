"""The mutant registry: every deliberately broken target, with its one fault."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Callable

from ..contract import contract_builder
from ..contract import oracle
from ..failures import HarnessError


@dataclass(frozen=True)
class Mutant:
    """One broken target: what its fault is, the bug class of the contract's
    table it reproduces, and the properties that must kill it (ci profile)."""

    name: str
    description: str
    bug_class: str
    killed_by: tuple[str, ...]
    target: types.SimpleNamespace  # build_c128a_topk_metadata, maybe a width policy
    examples: int | None = None  # generated examples its kill may take; None: the matrix's

    @property
    def spec(self) -> str:
        return f"c128a.mutants:{self.name}"


MUTANTS: dict[str, Mutant] = {}
"""Mutant name -> :class:`Mutant`, in registration order."""


def _register(mutant: Mutant) -> Mutant:
    if mutant.name in MUTANTS:
        raise HarnessError(f"mutant {mutant.name!r} is registered twice")
    MUTANTS[mutant.name] = mutant
    return mutant


def register(mutant: Mutant) -> Mutant:
    """Register a mutant whose target is put together elsewhere (a consumer
    fault, a keyed launcher that lives with the kernels)."""
    return _register(mutant)


def builder_mutant(
    description: str, bug_class: str, killed_by: tuple[str, ...], *,
    examples: int | None = None, **declarations
):
    """Register ``_build_NAME(args)`` (a faulty builder written against
    :class:`~c128a.contract.BuildArgs`) as mutant ``NAME``, with vLLM's
    signature and the target ``declarations`` (``padding_rows="inert"``, say);
    ``examples``: the generated examples its kill may take (a fault in a
    rare cell), None for the kill matrix's own count."""

    def register(build: Callable) -> Callable:
        name = build.__name__.removeprefix("_build_")
        target = types.SimpleNamespace(
            build_c128a_topk_metadata=contract_builder(build, name), **declarations
        )
        _register(Mutant(name, description, bug_class, killed_by, target, examples))
        return build

    return register


def policy_mutant(
    name: str,
    description: str,
    bug_class: str,
    killed_by: tuple[str, ...],
    **policy: Callable,
) -> None:
    """Register the oracle with a faulty ``active_topk_width`` and/or
    ``capacity_width`` as mutant ``name``."""
    target = types.SimpleNamespace(
        build_c128a_topk_metadata=oracle.build_c128a_topk_metadata, **policy
    )
    _register(Mutant(name, description, bug_class, killed_by, target))
