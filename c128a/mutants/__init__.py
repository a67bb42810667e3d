"""Deliberately broken targets: proof that the suite can fail.

Each mutant has exactly one fault and reproduces one bug class of the
contract's table; ``c128a.mutants:NAME`` is its target spec. They are pure
torch on top of the oracle's arithmetic: fast, and runnable on CPU and CUDA
tensors alike. Builder faults live in :mod:`.builders`, faults of a builder that
remembers its earlier calls in :mod:`.stateful`, faults of one that keeps
state keyed on the last step's shape in :mod:`.shape_history_faults`, width-policy faults in
:mod:`.policies`, and faults only the strategies' wider reach shows in
:mod:`.engine_scale` (thousands of tokens, hundreds of requests),
:mod:`.layouts` (buffers inside larger allocations), :mod:`.geometry`
(divisions by R and B), :mod:`.engine_input_faults` (inputs as an engine hands
them: slices, page slot ids, shared pages, past the engine's caps, and
builders that write their inputs) and :mod:`.consumer_faults` (a consumer of the views);
:data:`MUTANTS` describes each. (A fault only a compiled
kernel can have lives with the kernels: ``c128a.kernels.mutants``.)
"""

# Importing a module registers its mutants.
from . import (  # noqa: F401
    builders, consumer_faults, engine_input_faults, engine_scale, geometry, layouts, pair_faults,
    policies, shape_history_faults, stateful,
)
from .registry import MUTANTS, Mutant

__all__ = ["MUTANTS", "Mutant"]


def __getattr__(name: str):
    """``c128a.mutants.NAME`` is mutant NAME's target namespace."""
    try:
        return MUTANTS[name].target
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted([*globals(), *MUTANTS])
