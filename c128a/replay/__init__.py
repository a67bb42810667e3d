"""CUDA-graph replay: consumers captured once on the returned views, replayed
after every later step and checked against the oracle consumer; and the
serving-loop state machine that drives them."""

from .consumer import (
    KV_VALUE_BASE,
    OUT_OF_TABLE,
    ConsumerOutput,
    Geometry,
    consume,
    freeze,
    kv_table,
    sentinel_lengths,
)
from .harness import (
    ReplayHarness,
    StepOutcome,
    capture_sizes,
    pad_decode_to_capture_size,
    padded_size,
)
from .recorded import MachineStep, MachineSteps, machine_steps_of
from .serving import (
    COMPILE_KEYS_SETTINGS,
    build_machine,
    compile_keys_machine,
    serving_loop_machine,
)

__all__ = [
    "COMPILE_KEYS_SETTINGS",
    "KV_VALUE_BASE",
    "MachineStep",
    "MachineSteps",
    "OUT_OF_TABLE",
    "ConsumerOutput",
    "Geometry",
    "ReplayHarness",
    "StepOutcome",
    "build_machine",
    "compile_keys_machine",
    "capture_sizes",
    "consume",
    "freeze",
    "kv_table",
    "machine_steps_of",
    "pad_decode_to_capture_size",
    "padded_size",
    "sentinel_lengths",
    "serving_loop_machine",
]
