"""What a padding token's decode row holds: the contract's two variants.

A CUDA-graph padding token is a decode token with ``slot_mapping < 0`` (any
negative value). Both variants give it ``decode_lens`` 0; they differ in its
row (CONTRACT.md, "Padding rows"):

- ``slots`` (vLLM 0.33.0 and 0.34.0, the default): the row is written as for
  a real token, real slot ids in columns < n(t), -1 in [n(t), W);
- ``inert`` (upstream's newest test of the builder; vllm#55177): the row is
  -1 in every column < W, so it publishes no physical cache index.

A target declares its variant as ``padding_rows``; the suite can hold it to
the other one (``--c128a-padding-rows``, ``--padding-rows``).
"""

from __future__ import annotations

from typing import Literal, get_args

from ..failures import TargetSpecError

PaddingRows = Literal["slots", "inert"]
"""The annotation of a variant (a case's field, a fuzz option)."""

SLOTS, INERT = get_args(PaddingRows)
PADDING_ROWS: tuple[str, ...] = (SLOTS, INERT)
DEFAULT_PADDING_ROWS = SLOTS


def check_padding_rows(value, what: str) -> str:
    """``value`` when it names a variant; a :class:`~c128a.failures.TargetSpecError`
    naming ``what`` (the target, the option) and the two variants otherwise."""
    if value not in PADDING_ROWS:
        raise TargetSpecError(
            f"{what}: padding_rows={value!r} must be {SLOTS!r} (a padding token's decode row "
            f"holds real slot ids, vLLM 0.33/0.34) or {INERT!r} (the row is -1 in every "
            "column < W)"
        )
    return value


def padding_rows_of(target) -> str:
    """The variant ``target`` is held to: its ``padding_rows``, else the default.
    Read here alone, so every expected value of the suite follows one rule."""
    value = getattr(target, "padding_rows", None)
    if value is None:
        return DEFAULT_PADDING_ROWS
    return check_padding_rows(value, f"target {getattr(target, 'spec', target)!s}")
