"""How a target is judged: the contract's invariants as plain functions that
raise a readable diff, and the property registry that runs them."""

from .bad_input import BAD_INPUTS, BadInput, applicable_bad_inputs, check_rejects_bad_input
from .differential import (
    check_adaptive_equals_full,
    check_idempotent,
    check_independent,
    permuted_batch,
    rotated_table_batch,
    sub_batch,
)
from .one_build import (
    check_matches_oracle,
    check_padding,
    check_step,
    check_untouched_memory,
    check_views,
    decode_width,
    expected_result,
)
from .prior_content import check_history_independent, earlier_step, fill_seed
from .properties import PROPERTIES, Property
from .width_policy import CAPTURE_OVERSHOOT, check_width_policy, contract_capacity, contract_width

__all__ = [
    "BAD_INPUTS",
    "CAPTURE_OVERSHOOT",
    "PROPERTIES",
    "BadInput",
    "Property",
    "applicable_bad_inputs",
    "check_adaptive_equals_full",
    "check_history_independent",
    "check_idempotent",
    "check_independent",
    "check_matches_oracle",
    "check_padding",
    "check_rejects_bad_input",
    "check_step",
    "check_untouched_memory",
    "check_views",
    "check_width_policy",
    "contract_capacity",
    "contract_width",
    "decode_width",
    "earlier_step",
    "expected_result",
    "fill_seed",
    "permuted_batch",
    "rotated_table_batch",
    "sub_batch",
]
