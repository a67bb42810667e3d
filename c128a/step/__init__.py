"""The model of one engine step: the builder's inputs as plain data
(:class:`Batch`, assembled from requests by :func:`assemble_batch`), the
persistent buffers, and one build of a step into them."""

from .batch import (
    MAX_BUFFER_ELEMENTS,
    MAX_CASE_CAPACITY,
    MAX_CASE_MODEL_LEN,
    MAX_BUFFER_ROWS,
    PAGE_PRIME,
    Batch,
    BatchTensors,
    BlockTable,
    PaddingToken,
    PermutedBlockTable,
    StepRequest,
    assemble_batch,
    page_modulus,
)
from .buffers import POISON, BufferLayout, Buffers, BuildResult
from .builds import build, oracle_build
from .inputs import InputPlacement
from .prior import PriorStep

__all__ = [
    "MAX_BUFFER_ELEMENTS",
    "MAX_CASE_CAPACITY",
    "MAX_CASE_MODEL_LEN",
    "MAX_BUFFER_ROWS",
    "PAGE_PRIME",
    "POISON",
    "Batch",
    "BatchTensors",
    "BlockTable",
    "BufferLayout",
    "Buffers",
    "BuildResult",
    "InputPlacement",
    "PaddingToken",
    "PermutedBlockTable",
    "PriorStep",
    "StepRequest",
    "assemble_batch",
    "build",
    "oracle_build",
    "page_modulus",
]
