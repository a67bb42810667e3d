"""How steps are drawn: Hypothesis strategies for engine-shaped builder
inputs, and the contract's historical failures as concrete steps."""

from .engine import (
    EDGE_MAX_MODEL_LENS,
    batches,
    block_tables,
    capacities,
    max_model_lens,
    pages_for,
)
from .history import HISTORICAL_BATCHES, engine_batch

__all__ = [
    "EDGE_MAX_MODEL_LENS",
    "HISTORICAL_BATCHES",
    "batches",
    "block_tables",
    "capacities",
    "engine_batch",
    "max_model_lens",
    "pages_for",
]
