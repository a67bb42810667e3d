"""How big a drawn step may be: a size budget per device.

Most examples are small steps (a few dozen tokens): they run fast and still
reach every edge of the contract that does not need size. One example in
:attr:`SizeBudget.engine_one_in` is instead an engine-scale step: hundreds to
thousands of tokens and up to 512 requests, or past 8,192 tokens (an engine
configured with a larger ``max_num_batched_tokens``). Its capacity is then
held so that tokens x capacity (the widest build any property makes of it,
the full-width build of ``adaptive_equals_full`` included) stays within
:attr:`SizeBudget.max_elements`.

The device sets the budget because the device sets the price. Triton's
interpreter pays per program, so an engine-scale build on the CPU is slow,
the more so the wider its rows, and vLLM's kernel (one program per token)
slower than the project's (docs/measurements.md, "Measurements behind the code's
choices"). A GPU builds any of them at once, and the host's own work
(drawing, the oracle, comparisons) becomes the price. The profile sets how
many examples run, so the count of engine-scale steps follows the profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract.validation import check, check_positive_int

ENGINE_TOKENS = 8_192
"""An engine's usual ``max_num_batched_tokens``."""

MAX_REQUESTS = 512
"""The most requests one engine step schedules."""


@dataclass(frozen=True)
class SizeBudget:
    """One example in ``engine_one_in`` is an engine-scale step of up to
    ``max_tokens`` tokens whose tokens x capacity stays within ``max_elements``."""

    engine_one_in: int
    max_elements: int
    max_tokens: int = 2 * ENGINE_TOKENS

    def __post_init__(self):
        check_positive_int("engine_one_in", self.engine_one_in)
        check_positive_int("max_elements", self.max_elements)
        check(
            self.max_tokens > ENGINE_TOKENS,
            f"max_tokens={self.max_tokens} must be > {ENGINE_TOKENS}: the budget must reach "
            "steps past the engine's usual token count",
        )


CPU_BUDGET = SizeBudget(engine_one_in=8, max_elements=9_216 * 128, max_tokens=9_216)
"""Under Triton's interpreter: one example in 8 at engine scale, up to 9,216
tokens (past the engine's usual 8,192 at C = 128) and 1,179,648 elements
(1,024 tokens at C = 1,152: the largest build the interpreter runs without
slowing a run down much; docs/measurements.md, "Measurements behind the code's choices")."""

GPU_BUDGET = SizeBudget(engine_one_in=8, max_elements=1 << 26)
"""On a GPU: one example in 8, up to 16,384 tokens and 8,192 x 8,192 elements
(1M context). The oracle and the comparisons run on the host, where such a
step holds about 2 GB of temporaries per worker process."""

def size_budget(device) -> SizeBudget:
    """The budget of ``device`` (a name or a ``torch.device``)."""
    kind = getattr(device, "type", device)
    return GPU_BUDGET if kind == "cuda" else CPU_BUDGET
